//! llama.cpp's KV block formats (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl) byte
//! for byte as ggml writes them: our quantizer, and the cache store built on
//! it, against the `gguf` Python package's reference quantizers and, for
//! iq4_nl (which the package cannot quantize), ggml's own
//! `quantize_row_iq4_nl_ref` from its base library
//! (`fixtures/gguf/quantize_rows.py`, run in the reference environment) on
//! random rows, rows made to hit the rounding's edges, and the default
//! model's real keys and values. One difference is allowed, and only in a
//! block of zeros: a zero scale's sign, which NumPy's reductions pick by
//! lane order and ours take from ggml's C reference, or iq4_nl's levels,
//! which ggml leaves as its previous block set them (`quant::quantize` says
//! how); the block decodes to the same zeros.
//!
//! Needs the reference environment with `gguf` 0.17.1 and ggml's base
//! library (`cargo xtask setup` makes both; `GEMMA_MLX_SKIP_PARITY=1`
//! skips) and the default model.

mod common;

use std::path::Path;
use std::process::Command;

use common::mlx_lm::python;
use common::models::{corpus_text, with_default_model};
use common::ours::token_array;
use common::workspace_root;
use gemma::cache::{CacheFormat, KvFormat, KvStore};
use gemma::quant::{dequantize, quantize_into, GgufDtype, QUANTIZABLE};
use mlx_core::{random, Array, Dtype};

/// Values per row: the default model's head dimension.
const WIDTH: usize = 256;

/// Tokens of real text whose keys and values are quantized.
const TOKENS: usize = 256;

/// Random rows: normal, heavy-tailed and tiny, reproducible from a seed.
fn random_rows() -> Vec<f32> {
    let draw = |rows: i32, seed: u64| {
        let key = random::key(seed).expect("key");
        random::normal(&[rows, WIDTH as i32], Dtype::Float32, 0.0, 1.0, Some(&key))
            .and_then(|a| a.to_vec::<f32>())
            .expect("normal samples")
    };
    let mut rows = draw(256, 1);
    // Heavy tails: cubes of normals, one scale per row over six decades.
    for (i, v) in draw(64, 2).into_iter().enumerate() {
        let scale = 10f32.powi((i / WIDTH) as i32 % 7 - 3);
        rows.push(v * v * v * scale);
    }
    // Scales below f16's smallest normal, and around its largest.
    for (i, v) in draw(8, 3).into_iter().enumerate() {
        rows.push(v * if i < 4 * WIDTH { 1e-7 } else { 2e5 });
    }
    rows
}

/// Rows made to land on the quantizers' edges: all zeros (with a leading
/// −0), a constant row, magnitudes tied between signs (either first),
/// values on exact half steps of q8_0's and the 4- and 5-bit formats'.
fn edge_rows() -> Vec<f32> {
    let mut rows = Vec::new();
    let mut row = |f: &dyn Fn(usize) -> f32| rows.extend((0..WIDTH).map(f));
    row(&|_| 0.0);
    row(&|i| if i == 0 { -0.0 } else { 0.0 });
    row(&|_| 0.37);
    row(&|i| match i % 32 {
        0 => 2.5,
        7 => -2.5,
        _ => (i % 5) as f32 * 0.25 - 0.5,
    });
    row(&|i| match i % 32 {
        3 => -4.0,
        9 => 4.0,
        _ => (i % 9) as f32 * 0.5 - 2.0,
    });
    // max 127: q8_0's d is 1 and k + 0.5 sits on a half step.
    row(&|i| {
        if i % 32 == 0 {
            127.0
        } else {
            (i % 32) as f32 - 16.5
        }
    });
    // max −8 (q4_0: d = 1), −16 (q5_0: d = 1): x + 8.5 and x + 16.5 whole.
    row(&|i| {
        if i % 32 == 0 {
            -8.0
        } else {
            (i % 16) as f32 * 0.5 - 4.0
        }
    });
    row(&|i| {
        if i % 32 == 0 {
            -16.0
        } else {
            (i % 32) as f32 - 16.5
        }
    });
    // min 0, max 15 and 31: (x − min) · id + 0.5 on whole numbers.
    row(&|i| (i % 16) as f32 + if i % 2 == 0 { 0.5 } else { 0.0 });
    row(&|i| (i % 32) as f32 * 31.0 / 31.0);
    rows
}

/// The default model's keys and values over `TOKENS` tokens of real text
/// (`<bos>` first), every layer's, as they enter the cache.
fn model_rows() -> Vec<f32> {
    with_default_model(false, |m| {
        let mut ids = vec![m.tokenizer.bos_id()];
        ids.extend(m.tokenizer.encode_plain(&corpus_text()).expect("tokens"));
        ids.truncate(TOKENS);
        let mut caches = m.model.make_caches(CacheFormat::COMPUTE).expect("caches");
        m.model
            .forward(&token_array(&ids), &mut caches)
            .and_then(|l| Ok(l.eval()?))
            .expect("forward");
        let mut rows = Vec::new();
        for cache in &caches {
            for array in cache.arrays() {
                let shape = array.shape();
                assert_eq!(shape[3] as usize, WIDTH);
                let held = array
                    .slice(
                        &[0, 0, 0, 0],
                        &[1, shape[1], TOKENS as i32, shape[3]],
                        &[1; 4],
                    )
                    .and_then(|a| a.astype(Dtype::Float32))
                    .and_then(|a| a.to_vec::<f32>())
                    .expect("cache rows");
                rows.extend(held);
            }
        }
        rows
    })
}

/// ggml's base library, as `cargo xtask setup` builds it from stock
/// llama.cpp's source (`GEMMA_MLX_GGML_BASE` names another).
fn ggml_base() -> std::path::PathBuf {
    let path = std::env::var_os("GEMMA_MLX_GGML_BASE").map_or_else(
        || workspace_root().join("target/llamacpp/llama.cpp/build/bin/libggml-base.so"),
        std::path::PathBuf::from,
    );
    assert!(
        path.is_file(),
        "ggml's base library {} is missing: run `cargo xtask setup` (or set \
         GEMMA_MLX_GGML_BASE; GEMMA_MLX_SKIP_PARITY=1 skips)",
        path.display()
    );
    path
}

/// The oracle's blocks of `rows` for every block format, or `None` when
/// told to skip.
fn oracle_blocks(rows: &[f32]) -> Option<Vec<(GgufDtype, Vec<u8>)>> {
    let python = python()?;
    let library = ggml_base();
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("rows.f32");
    let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&input, bytes).expect("write rows");
    let names: Vec<String> = QUANTIZABLE.map(|t| t.to_string().to_lowercase()).to_vec();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/quantize_rows.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&input)
        .arg(WIDTH.to_string())
        .arg(dir.path())
        .arg(&library)
        .args(&names)
        .output()
        .expect("run the gguf oracle");
    assert!(
        out.status.success(),
        "{} failed (the reference environment needs gguf 0.17.1 and ggml's base library: \
         `cargo xtask setup`):\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(
        QUANTIZABLE
            .iter()
            .zip(&names)
            .map(|(t, name)| {
                let path = dir.path().join(format!("{name}.bin"));
                (*t, std::fs::read(&path).expect("oracle output"))
            })
            .collect(),
    )
}

/// Our quantizer's bytes of `rows` equal the oracle's, block by block.
fn assert_bytes_equal(what: &str, rows: &[f32]) {
    let Some(theirs) = oracle_blocks(rows) else {
        return;
    };
    for (dtype, theirs) in theirs {
        let block = dtype.type_size() as usize;
        let mut ours = vec![0u8; rows.len() / 32 * block];
        quantize_into(dtype, rows, &mut ours).expect("quantize");
        assert_eq!(ours.len(), theirs.len(), "{what} {dtype}: sizes");
        let zeros = |b: usize| rows[b * 32..b * 32 + 32].iter().all(|v| *v == 0.0);
        let mut zero_signs = 0;
        let first = ours
            .chunks(block)
            .zip(theirs.chunks(block))
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, (a, b))| {
                let decoded = |bytes: &[u8]| dequantize(dtype, bytes).expect("decode");
                if zeros(i) && decoded(a) == decoded(b) {
                    zero_signs += 1;
                }
                i
            })
            .find(|&i| !zeros(i));
        if let Some(b) = first {
            panic!(
                "{what} {dtype}: block {b} differs\n values {:?}\n ours   {:?}\n oracle {:?}",
                &rows[b * 32..b * 32 + 32],
                &ours[b * block..(b + 1) * block],
                &theirs[b * block..(b + 1) * block]
            );
        }
        println!(
            "{what} {dtype}: {} blocks byte-equal to the oracle, {zero_signs} blocks of zeros \
             stored otherwise",
            ours.len() / block - zero_signs
        );
    }
}

#[test]
fn random_rows_quantize_as_the_oracle_quantizes_them() {
    assert_bytes_equal("random rows", &random_rows());
}

#[test]
fn edge_rows_quantize_as_the_oracle_quantizes_them() {
    assert_bytes_equal("edge rows", &edge_rows());
}

#[test]
fn the_models_keys_and_values_quantize_as_the_oracle_quantizes_them() {
    let rows = model_rows();
    assert!(rows.iter().any(|v| *v != 0.0) && rows.iter().all(|v| v.is_finite()));
    assert_bytes_equal("model keys and values", &rows);
}

#[test]
fn the_cache_store_holds_the_quantizers_bytes() {
    let rows = random_rows();
    let n = (rows.len() / WIDTH) as i32;
    let x = Array::from_slice(&rows, &[1, 1, n, WIDTH as i32]).expect("array");
    for dtype in QUANTIZABLE {
        let KvStore::Block(stored) = KvStore::encode(&x, KvFormat::Block(dtype)).expect("encode")
        else {
            panic!("{dtype}: not a block store");
        };
        let bytes: Vec<u8> = match stored.bytes.dtype() {
            Dtype::Int8 => stored
                .bytes
                .to_vec::<i8>()
                .expect("bytes")
                .iter()
                .map(|&b| b as u8)
                .collect(),
            Dtype::Int16 => stored
                .bytes
                .to_vec::<i16>()
                .expect("bytes")
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            other => panic!("{dtype}: blocks held as {other:?}"),
        };
        let mut expected = vec![0u8; bytes.len()];
        quantize_into(dtype, &rows, &mut expected).expect("quantize");
        assert!(bytes == expected, "{dtype}: the store's bytes differ");
    }
}
