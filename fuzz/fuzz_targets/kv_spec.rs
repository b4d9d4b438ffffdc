//! KV-cache specs (`ctk=q8_0,ctv=mlx4,group=64,start=0`, with any number of
//! `;LAYERS:SETTINGS` policy parts).
//!
//! The input is the spec text (bytes that are not UTF-8 become U+FFFD, as
//! a command line would not hold them anyway). Invariants: parsing never
//! panics and an error names the spec; on the 270M shape a parsed spec's
//! layers resolve, or the error names the spec, and every layer's cache
//! format is valid for its head; a spec's canonical form and its canonical
//! form on the model, for every compute dtype, parse to specs with the same
//! canonical forms and the same storage in every layer (the compute dtype
//! made explicit).

#![no_main]

use std::sync::OnceLock;

use engine::kv_spec::{KvSpec, KvType, LayerSpec};
use gemma::cache::Rotation;
use gemma::config::Gemma3Config;
use libfuzzer_sys::fuzz_target;
use mlx_core::Dtype;

fn model() -> &'static Gemma3Config {
    static CONFIG: OnceLock<Gemma3Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        Gemma3Config::published("270m", None).expect("the published 270M configuration")
    })
}

/// The layers' storage with the compute dtype made explicit; a side's group
/// only where it is MLX affine (the one kind it applies to).
fn storage(layers: &[LayerSpec], compute: Dtype) -> Vec<(KvType, KvType, Option<i32>, Rotation)> {
    let explicit = |t: KvType| match t {
        KvType::Compute => KvType::Float(compute),
        other => other,
    };
    let affine = |t: KvType| matches!(t, KvType::Affine(_));
    layers
        .iter()
        .map(|l| {
            let group = (affine(l.keys) || affine(l.values)).then_some(l.group_size);
            (explicit(l.keys), explicit(l.values), group, l.rotation)
        })
        .collect()
}

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
    let config = model();
    let layers = match spec.layer_specs(config) {
        Ok(layers) => layers,
        Err(e) => {
            assert_eq!(e.spec, text, "the error names the spec");
            return;
        }
    };
    assert_eq!(layers.len(), config.num_hidden_layers);
    for layer in &layers {
        layer
            .format()
            .validate(config.head_dim as i32)
            .unwrap_or_else(|e| panic!("'{text}': {layer:?} on a 256-wide head: {e}"));
    }
    spec.layer_formats(config)
        .unwrap_or_else(|e| panic!("'{text}': layer specs resolve but formats fail: {e}"));
    for compute in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
        let expected = storage(&layers, compute);
        let on_model = spec
            .canonical_on(compute, config)
            .unwrap_or_else(|e| panic!("'{text}': {e}"));
        for canonical in [spec.canonical(compute), on_model] {
            let again = KvSpec::parse(&canonical)
                .unwrap_or_else(|e| panic!("canonical form '{canonical}' of '{text}': {e}"));
            assert_eq!(again.canonical(compute), canonical, "'{text}'");
            assert_eq!(again.start, spec.start, "'{canonical}'");
            assert_eq!(again.queries, spec.queries, "'{canonical}'");
            let again_layers = again
                .layer_specs(config)
                .unwrap_or_else(|e| panic!("canonical form '{canonical}' of '{text}': {e}"));
            assert_eq!(storage(&again_layers, compute), expected, "'{canonical}'");
        }
    }
});
