//! The GGUF reader on the real default model, against values the `gguf`
//! Python package computed (`fixtures/gguf/model_reference.json`, written by
//! `fixtures/gguf/make_fixtures.py`).
//!
//! The reference values belong to one exact file, so these tests read
//! `<workspace>/target/model/gemma-3-270m-q4_k_m.gguf` and ignore
//! `GEMMA_MLX_MODEL`. They skip, saying so, only when that file is missing.

use std::path::{Path, PathBuf};
use std::time::Instant;

use gemma::gguf::GgufFile;
use gemma::quant::GgufDtype;
use serde_json::Value;

fn model_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/model/gemma-3-270m-q4_k_m.gguf")
}

/// The default model, or `None` (with a message) when it is not there.
fn open_model() -> Option<GgufFile> {
    let path = model_path();
    if !path.exists() {
        println!(
            "SKIPPED: the default model {} is missing (run the model download first)",
            path.display()
        );
        return None;
    }
    Some(GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}")))
}

fn reference() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/model_reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn as_u64(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

#[test]
fn header_matches_gguf_py() {
    let Some(file) = open_model() else { return };
    let reference = reference();
    let size = std::fs::metadata(file.path()).expect("stat").len();
    assert_eq!(
        size,
        as_u64(&reference["file_size"]),
        "not the reference model file"
    );
    assert_eq!(u64::from(file.version()), as_u64(&reference["version"]));
    assert_eq!(
        file.tensors().len() as u64,
        as_u64(&reference["tensor_count"])
    );
    assert_eq!(
        file.metadata().len() as u64,
        as_u64(&reference["metadata_count"])
    );
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.data_offset(), 6_525_120);
    assert_eq!(
        file.get("general.architecture").and_then(|v| v.as_str()),
        Some("gemma3")
    );
    let tokens = file
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .expect("tokens");
    assert_eq!(tokens.len(), 262_144);
    assert_eq!(tokens.get(2).and_then(|t| t.as_str()), Some("<bos>"));

    let mut counts = std::collections::BTreeMap::new();
    for t in file.tensors() {
        *counts.entry(t.dtype.to_string()).or_insert(0) += 1;
    }
    let expected: Vec<(String, i32)> = [
        ("F32", 109),
        ("Q4_K", 27),
        ("Q5_0", 81),
        ("Q6_K", 9),
        ("Q8_0", 10),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), *v))
    .collect();
    assert_eq!(counts.into_iter().collect::<Vec<_>>(), expected);

    let embd = file.tensor("token_embd.weight").expect("token_embd");
    assert_eq!(embd.shape, vec![640, 262_144]);
    assert_eq!(embd.row_major_shape(), vec![262_144, 640]);
    assert_eq!(embd.dtype, GgufDtype::Q8_0);
}

#[test]
fn dequantized_tensors_match_gguf_py() {
    let Some(file) = open_model() else { return };
    let reference = reference();
    let tensors = reference["tensors"].as_array().expect("tensors");
    let mut dtypes_seen = std::collections::BTreeSet::new();
    for r in tensors {
        let name = r["name"].as_str().expect("name");
        let info = file
            .tensor(name)
            .unwrap_or_else(|| panic!("tensor {name} missing"));
        assert_eq!(
            info.dtype.to_string(),
            r["dtype"].as_str().expect("dtype"),
            "{name}"
        );
        let shape: Vec<u64> = r["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(as_u64)
            .collect();
        assert_eq!(info.shape, shape, "{name}");
        assert_eq!(info.offset, as_u64(&r["offset"]), "{name}");
        assert_eq!(info.n_bytes, as_u64(&r["n_bytes"]), "{name}");
        assert_eq!(file.tensor_bytes(info).len() as u64, info.n_bytes, "{name}");

        let values = file.dequantize_f32(name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(values.len() as u64, info.n_elements(), "{name}");
        let first = r["first_values_f32_bits"].as_array().expect("first values");
        for (i, bits) in first.iter().enumerate() {
            let ours = values[i];
            assert_eq!(
                ours.to_bits() as u64,
                as_u64(bits),
                "{name}: element {i} is {ours}"
            );
        }
        // Summation order differs (numpy sums pairwise), so the f64 sums agree
        // to rounding, far below any single-element change.
        let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
        let abs_sum: f64 = values.iter().map(|&v| f64::from(v).abs()).sum();
        let ref_sum = r["sum"].as_f64().expect("sum");
        let ref_abs = r["abs_sum"].as_f64().expect("abs_sum");
        assert!(
            (sum - ref_sum).abs() <= 1e-9 * ref_abs,
            "{name}: sum {sum} vs {ref_sum}"
        );
        assert!(
            (abs_sum - ref_abs).abs() <= 1e-9 * ref_abs,
            "{name}: abs sum {abs_sum} vs {ref_abs}"
        );
        dtypes_seen.insert(info.dtype.to_string());
    }
    assert_eq!(
        dtypes_seen.len(),
        5,
        "reference covers F32, Q8_0, Q5_0, Q4_K, Q6_K"
    );
}

/// Prints how long dequantizing every tensor of the default model takes.
/// Run with `cargo test -p gemma --release --test gguf_model -- --ignored --nocapture`.
#[test]
#[ignore = "timing report, run by hand"]
fn dequantize_whole_model_timing() {
    let Some(file) = open_model() else { return };
    // Touch the pages first so the timing measures decoding, not disk reads.
    let touched: u64 = file
        .tensors()
        .iter()
        .map(|t| {
            file.tensor_bytes(t)
                .iter()
                .step_by(4096)
                .map(|&b| u64::from(b))
                .sum::<u64>()
        })
        .sum();
    let start = Instant::now();
    let mut n_values = 0usize;
    for t in file.tensors() {
        n_values += file
            .dequantize_f32(&t.name)
            .unwrap_or_else(|e| panic!("{e}"))
            .len();
    }
    let elapsed = start.elapsed();
    println!(
        "dequantized {n_values} values in {:.3} s on {} threads (page checksum {touched})",
        elapsed.as_secs_f64(),
        rayon::current_num_threads()
    );
}
