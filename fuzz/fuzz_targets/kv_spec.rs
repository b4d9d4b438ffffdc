//! KV-cache specs (`ctk=q8_0,ctv=mlx4,group=64,start=0`).
//!
//! The input is the spec text (bytes that are not UTF-8 become U+FFFD, as
//! a command line would not hold them anyway). Invariants: parsing never
//! panics and an error names the spec; a parsed spec's canonical form, for
//! every compute dtype, parses to a spec with the same canonical form and
//! the same storage (group, start, and each side, the compute dtype made
//! explicit); its cache format is available.

#![no_main]

use engine::kv_spec::{KvSpec, KvType};
use libfuzzer_sys::fuzz_target;
use mlx_core::Dtype;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let spec = match KvSpec::parse(&text) {
        Ok(spec) => spec,
        Err(e) => {
            assert_eq!(e.spec, text, "the error names the spec");
            return;
        }
    };
    assert_eq!(spec.text, text);
    assert!(matches!(spec.group_size, 32 | 64 | 128), "{spec:?}");
    spec.cache_format()
        .expect("a parsed spec has a cache format");
    for compute in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
        let canonical = spec.canonical(compute);
        let again = KvSpec::parse(&canonical)
            .unwrap_or_else(|e| panic!("canonical form '{canonical}' of '{text}': {e}"));
        assert_eq!(again.canonical(compute), canonical, "'{text}'");
        assert_eq!(again.start, spec.start, "'{canonical}'");
        let explicit = |t: KvType| match t {
            KvType::Compute => KvType::Float(compute),
            other => other,
        };
        assert_eq!(explicit(again.keys), explicit(spec.keys), "'{canonical}'");
        assert_eq!(
            explicit(again.values),
            explicit(spec.values),
            "'{canonical}'"
        );
        let turbo = |t: KvType| matches!(t, KvType::Turbo(_));
        if !turbo(spec.keys) && !turbo(spec.values) {
            assert_eq!(again.group_size, spec.group_size, "'{canonical}'");
        }
    }
});
