//! Every dequantizer against the `gguf` Python package, on random blocks
//! committed by `fixtures/gguf/make_fixtures.py`.

mod gguf_support;

use std::path::{Path, PathBuf};

use gemma::gguf::GgufValue;
use gemma::quant::{dequantize, DequantError, GgufDtype};
use gguf_support::{open_bytes, Builder};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/blocks")
}

/// The committed random blocks of `dtype` and their reference values.
fn fixture(dtype: GgufDtype) -> (Vec<u8>, Vec<f32>) {
    let name = dtype.to_string().to_lowercase();
    let read = |suffix: &str| {
        let path = fixture_dir().join(format!("{name}.{suffix}"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let expected = read("expected.bin")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (read("blocks.bin"), expected)
}

/// Dequantizes the fixture of `dtype` and requires bit-identical results.
fn check_bit_exact(dtype: GgufDtype) {
    let (blocks, expected) = fixture(dtype);
    let n_blocks = blocks.len() as u64 / dtype.type_size();
    assert_eq!(
        expected.len() as u64,
        n_blocks * dtype.block_size(),
        "{dtype}: fixture sizes disagree"
    );
    let ours = dequantize(dtype, &blocks).expect("dequantize");
    assert_eq!(ours.len(), expected.len(), "{dtype}: value count");
    for (i, (a, b)) in ours.iter().zip(&expected).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "{dtype}: element {i} (block {}): ours {a}, gguf-py {b}",
            i as u64 / dtype.block_size()
        );
    }
    assert!(
        expected.iter().any(|v| *v != 0.0),
        "{dtype}: fixture is all zeros"
    );
}

#[test]
fn f32_matches_gguf_py() {
    check_bit_exact(GgufDtype::F32);
}

#[test]
fn f16_matches_gguf_py() {
    check_bit_exact(GgufDtype::F16);
}

#[test]
fn bf16_matches_gguf_py() {
    check_bit_exact(GgufDtype::BF16);
}

#[test]
fn q4_0_matches_gguf_py() {
    check_bit_exact(GgufDtype::Q4_0);
}

#[test]
fn q4_1_matches_gguf_py() {
    check_bit_exact(GgufDtype::Q4_1);
}

#[test]
fn q5_0_matches_gguf_py() {
    check_bit_exact(GgufDtype::Q5_0);
}

#[test]
fn q5_1_matches_gguf_py() {
    check_bit_exact(GgufDtype::Q5_1);
}

#[test]
fn q8_0_matches_gguf_py() {
    check_bit_exact(GgufDtype::Q8_0);
}

#[test]
fn iq4_nl_matches_gguf_py() {
    check_bit_exact(GgufDtype::IQ4_NL);
}

#[test]
fn q2_k_matches_gguf_py() {
    check_bit_exact(GgufDtype::Q2_K);
}

#[test]
fn q3_k_matches_gguf_py() {
    check_bit_exact(GgufDtype::Q3_K);
}

#[test]
fn q4_k_matches_gguf_py() {
    check_bit_exact(GgufDtype::Q4_K);
}

#[test]
fn q5_k_matches_gguf_py() {
    check_bit_exact(GgufDtype::Q5_K);
}

#[test]
fn q6_k_matches_gguf_py() {
    check_bit_exact(GgufDtype::Q6_K);
}

/// A Q4_0 block decoded by hand: scale 0.5, nibbles 0..15 then 15..0.
#[test]
fn q4_0_hand_computed_block() {
    let mut block = half::f16::from_f32(0.5).to_bits().to_le_bytes().to_vec();
    block.extend((0u8..16).map(|j| j | ((15 - j) << 4)));
    let values = dequantize(GgufDtype::Q4_0, &block).expect("dequantize");
    let expected: Vec<f32> = (0..16)
        .map(|j| 0.5 * (j as f32 - 8.0))
        .chain((0..16).map(|j| 0.5 * ((15 - j) as f32 - 8.0)))
        .collect();
    assert_eq!(values, expected);
}

#[test]
fn dequantize_rejects_partial_blocks() {
    let err = dequantize(GgufDtype::Q8_0, &[0u8; 35]).expect_err("35 bytes are not Q8_0 blocks");
    assert_eq!(
        err,
        DequantError::PartialBlock {
            dtype: GgufDtype::Q8_0,
            len: 35,
            type_size: 34
        }
    );
}

#[test]
fn can_dequantize_agrees_with_dequantize() {
    for id in 0..64 {
        let Some(dtype) = GgufDtype::from_id(id) else {
            continue;
        };
        assert_eq!(dtype.id(), id);
        let result = dequantize(dtype, &[]);
        assert_eq!(
            dtype.can_dequantize(),
            result.is_ok(),
            "{dtype}: can_dequantize disagrees with dequantize ({result:?})"
        );
    }
}

/// The whole path: blocks in a GGUF file, read back through `GgufFile::dequantize_f32`.
#[test]
fn dequantize_f32_reads_tensors_from_a_file() {
    let (q6k_blocks, q6k_expected) = fixture(GgufDtype::Q6_K);
    let (q5_0_blocks, q5_0_expected) = fixture(GgufDtype::Q5_0);
    let bytes = Builder::default()
        .meta("general.architecture", GgufValue::String("test".into()))
        .tensor("a", &[512, 2], GgufDtype::Q6_K.id(), q6k_blocks)
        .tensor("b", &[64, 4], GgufDtype::Q5_0.id(), q5_0_blocks)
        .tensor("c", &[256], GgufDtype::Q8_K.id(), vec![0; 292])
        .build();
    let (_dir, opened) = open_bytes("blocks.gguf", &bytes);
    let file = opened.expect("open");
    assert_eq!(file.dequantize_f32("a").expect("a"), q6k_expected);
    assert_eq!(file.dequantize_f32("b").expect("b"), q5_0_expected);
    let missing = file.dequantize_f32("zzz").expect_err("no such tensor");
    assert!(
        missing.to_string().contains("no tensor named 'zzz'"),
        "{missing}"
    );
    let q8k = file
        .dequantize_f32("c")
        .expect_err("Q8_K has no dequantizer");
    assert!(
        q8k.to_string()
            .contains("tensor 'c': type Q8_K cannot be dequantized"),
        "{q8k}"
    );
}
