//! Damaged and hostile GGUF files: each gives an error naming the file and the
//! problem, never a panic or a huge allocation.

mod gguf_support;

use std::io::Read;

use gemma::gguf::{GgufError, GgufProblem, GgufValue};
use gemma::quant::GgufDtype;
use gguf_support::{open_bytes, open_err, put_string, Builder, Entry, Tensor};

/// A small valid file: two metadata entries, one Q8_0 and one F32 tensor.
fn valid() -> Builder {
    Builder::default()
        .meta("general.architecture", GgufValue::String("gemma3".into()))
        .meta(
            "tokenizer.ggml.tokens",
            GgufValue::Array(vec![
                GgufValue::String("<pad>".into()),
                GgufValue::String("<eos>".into()),
            ]),
        )
        .tensor("w", &[32, 2], GgufDtype::Q8_0.id(), vec![0; 68])
        .tensor("n", &[4], GgufDtype::F32.id(), vec![0; 16])
}

fn message(e: &GgufError) -> String {
    e.to_string()
}

#[test]
fn the_valid_base_file_opens() {
    let (_dir, opened) = open_bytes("valid.gguf", &valid().build());
    let file = opened.expect("the base file must be valid for the other cases to mean anything");
    assert_eq!(file.tensors().len(), 2);
}

#[test]
fn bad_magic() {
    let mut bytes = valid().build();
    bytes[..4].copy_from_slice(b"GGML");
    let e = open_err("magic.gguf", &bytes);
    assert!(matches!(e.problem, GgufProblem::BadMagic { .. }), "{e}");
    assert!(message(&e).contains("not a GGUF file"), "{e}");
}

#[test]
fn unsupported_versions() {
    for version in [1u32, 4, 0x0300_0000] {
        let bytes = Builder { version, ..valid() }.build();
        let e = open_err("version.gguf", &bytes);
        assert!(
            matches!(e.problem, GgufProblem::UnsupportedVersion(v) if v == version),
            "{e}"
        );
    }
    let (_dir, v2) = open_bytes(
        "v2.gguf",
        &Builder {
            version: 2,
            ..valid()
        }
        .build(),
    );
    assert_eq!(v2.expect("version 2 is supported").version(), 2);
}

#[test]
fn empty_file() {
    let e = open_err("empty.gguf", &[]);
    assert!(matches!(e.problem, GgufProblem::Truncated { .. }), "{e}");
    assert!(message(&e).contains("the magic bytes"), "{e}");
}

#[test]
fn every_truncation_of_a_small_file_is_an_error() {
    let bytes = valid().build();
    for len in 0..bytes.len() {
        let e = open_err("cut.gguf", &bytes[..len]);
        assert!(
            matches!(
                e.problem,
                GgufProblem::Truncated { .. }
                    | GgufProblem::CountTooLarge { .. }
                    | GgufProblem::TensorPastEnd { .. }
            ),
            "cut at {len}: {e}"
        );
    }
}

#[test]
fn lying_tensor_count() {
    let bytes = Builder {
        tensor_count: Some(u64::MAX),
        ..valid()
    }
    .build();
    let e = open_err("tensors.gguf", &bytes);
    assert!(
        matches!(
            e.problem,
            GgufProblem::CountTooLarge {
                count: u64::MAX,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        message(&e).contains("the tensor count is 18446744073709551615"),
        "{e}"
    );
    // A modest lie: three tensors promised, two written. The third info is read
    // from the zero padding (an unnamed scalar), which moves the data section
    // so that the last tensor no longer fits.
    let bytes = Builder {
        tensor_count: Some(3),
        ..valid()
    }
    .build();
    let e = open_err("tensors3.gguf", &bytes);
    assert!(
        matches!(e.problem, GgufProblem::TensorPastEnd { .. }),
        "{e}"
    );
}

#[test]
fn lying_metadata_count() {
    let bytes = Builder {
        kv_count: Some(1 << 60),
        ..valid()
    }
    .build();
    let e = open_err("kv.gguf", &bytes);
    assert!(
        matches!(e.problem, GgufProblem::CountTooLarge { .. }),
        "{e}"
    );
    assert!(message(&e).contains("the metadata count"), "{e}");
}

#[test]
fn huge_string_length() {
    let mut raw = Vec::new();
    raw.extend_from_slice(&u64::MAX.to_le_bytes()); // key length
    raw.extend_from_slice(&[b'a'; 64]);
    let bytes = Builder {
        entries: vec![Entry::Raw(raw)],
        ..Builder::default()
    }
    .build();
    let e = open_err("string.gguf", &bytes);
    assert!(
        matches!(
            e.problem,
            GgufProblem::Truncated {
                needed: u64::MAX,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        message(&e).contains("a metadata key needs 18446744073709551615 bytes"),
        "{e}"
    );
}

#[test]
fn huge_array_count() {
    let mut raw = Vec::new();
    put_string(&mut raw, "tokenizer.ggml.scores");
    raw.extend_from_slice(&9u32.to_le_bytes()); // array
    raw.extend_from_slice(&6u32.to_le_bytes()); // of f32
    raw.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
    raw.extend_from_slice(&[0; 64]);
    let bytes = Builder {
        entries: vec![Entry::Raw(raw)],
        ..Builder::default()
    }
    .build();
    let e = open_err("array.gguf", &bytes);
    assert!(
        matches!(e.problem, GgufProblem::CountTooLarge { .. }),
        "{e}"
    );
    assert!(
        message(&e).contains("the length of metadata 'tokenizer.ggml.scores'"),
        "{e}"
    );
}

#[test]
fn deeply_nested_arrays() {
    let mut raw = Vec::new();
    put_string(&mut raw, "deep");
    raw.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..10_000 {
        raw.extend_from_slice(&9u32.to_le_bytes());
        raw.extend_from_slice(&1u64.to_le_bytes());
    }
    let bytes = Builder {
        entries: vec![Entry::Raw(raw)],
        ..Builder::default()
    }
    .build();
    let e = open_err("deep.gguf", &bytes);
    assert!(
        matches!(e.problem, GgufProblem::NestedTooDeep { .. }),
        "{e}"
    );
}

#[test]
fn unknown_value_type() {
    let mut raw = Vec::new();
    put_string(&mut raw, "odd");
    raw.extend_from_slice(&13u32.to_le_bytes());
    let bytes = Builder {
        entries: vec![Entry::Raw(raw)],
        ..Builder::default()
    }
    .build();
    let e = open_err("vtype.gguf", &bytes);
    assert!(
        matches!(e.problem, GgufProblem::UnknownValueType { id: 13, .. }),
        "{e}"
    );
    assert!(
        message(&e).contains("metadata 'odd' has unknown value type 13"),
        "{e}"
    );
}

#[test]
fn invalid_utf8_key() {
    let mut raw = Vec::new();
    raw.extend_from_slice(&2u64.to_le_bytes());
    raw.extend_from_slice(&[0xff, 0xfe]);
    raw.extend_from_slice(&4u32.to_le_bytes());
    raw.extend_from_slice(&1u32.to_le_bytes());
    let bytes = Builder {
        entries: vec![Entry::Raw(raw)],
        ..Builder::default()
    }
    .build();
    let e = open_err("utf8.gguf", &bytes);
    assert!(matches!(e.problem, GgufProblem::BadUtf8 { .. }), "{e}");
}

#[test]
fn duplicate_metadata_key() {
    let bytes = valid()
        .meta("general.architecture", GgufValue::String("x".into()))
        .build();
    let e = open_err("dupkey.gguf", &bytes);
    assert!(
        message(&e).contains("metadata key 'general.architecture' appears more than once"),
        "{e}"
    );
}

#[test]
fn unknown_tensor_type() {
    let bytes = valid()
        .tensor("blk.3.ffn_up.weight", &[32], 77, vec![0; 64])
        .build();
    let e = open_err("ttype.gguf", &bytes);
    assert!(
        matches!(e.problem, GgufProblem::UnknownTensorType { id: 77, .. }),
        "{e}"
    );
    assert!(
        message(&e).contains("tensor 'blk.3.ffn_up.weight' has unknown type id 77"),
        "{e}"
    );
}

#[test]
fn duplicate_tensor_name() {
    let bytes = valid()
        .tensor("w", &[4], GgufDtype::F32.id(), vec![0; 16])
        .build();
    let e = open_err("duptensor.gguf", &bytes);
    assert!(
        message(&e).contains("tensor 'w' appears more than once"),
        "{e}"
    );
}

#[test]
fn partial_blocks() {
    let bytes = valid()
        .tensor("q", &[100, 2], GgufDtype::Q4_K.id(), vec![0; 1024])
        .build();
    let e = open_err("partial.gguf", &bytes);
    assert!(
        matches!(
            e.problem,
            GgufProblem::PartialBlock {
                ne0: 100,
                block_size: 256,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        message(&e).contains("first dimension 100 is not a multiple of the Q4_K block size 256"),
        "{e}"
    );
}

#[test]
fn too_many_dimensions() {
    let bytes = valid()
        .tensor("t", &[1, 1, 1, 1, 1], GgufDtype::F32.id(), vec![0; 4])
        .build();
    let e = open_err("dims.gguf", &bytes);
    assert!(
        matches!(e.problem, GgufProblem::TooManyDims { n_dims: 5, .. }),
        "{e}"
    );
}

#[test]
fn element_count_overflow() {
    let bytes = valid()
        .tensor("big", &[1 << 40, 1 << 40], GgufDtype::F32.id(), vec![])
        .build();
    let e = open_err("overflow.gguf", &bytes);
    assert!(
        matches!(e.problem, GgufProblem::ShapeOverflow { .. }),
        "{e}"
    );
}

#[test]
fn misaligned_offset() {
    let mut b = valid();
    b.tensors.push(Tensor {
        name: "late".into(),
        shape: vec![4],
        type_id: GgufDtype::F32.id(),
        offset: Some(130),
        data: vec![0; 16],
    });
    let e = open_err("misaligned.gguf", &b.build());
    assert!(
        matches!(
            e.problem,
            GgufProblem::Misaligned {
                offset: 130,
                alignment: 32,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn tensor_data_past_the_end() {
    let mut bytes = valid().build();
    bytes.truncate(bytes.len() - 1);
    let e = open_err("short.gguf", &bytes);
    assert!(
        matches!(
            e.problem,
            GgufProblem::TensorPastEnd {
                needed: 16,
                left: 15,
                ..
            }
        ),
        "{e}"
    );
    assert!(message(&e).contains("tensor 'n' needs 16 bytes"), "{e}");

    let mut b = valid();
    b.tensors.push(Tensor {
        name: "far".into(),
        shape: vec![4],
        type_id: GgufDtype::F32.id(),
        offset: Some(u64::MAX - 31),
        data: vec![],
    });
    let e = open_err("far.gguf", &b.build());
    assert!(
        matches!(e.problem, GgufProblem::TensorPastEnd { left: 0, .. }),
        "{e}"
    );
}

#[test]
fn bad_alignment_value() {
    for value in [
        GgufValue::U32(0),
        GgufValue::U32(24),
        GgufValue::String("32".into()),
    ] {
        let bytes = valid().meta("general.alignment", value).build();
        let e = open_err("align.gguf", &bytes);
        assert!(matches!(e.problem, GgufProblem::BadMetadata { .. }), "{e}");
        assert!(message(&e).contains("metadata 'general.alignment'"), "{e}");
    }
}

#[test]
fn custom_alignment_is_honoured() {
    let b = Builder {
        alignment: 64,
        ..valid()
    }
    .meta("general.alignment", GgufValue::U32(64));
    let (_dir, opened) = open_bytes("align64.gguf", &b.build());
    let file = opened.expect("open");
    assert_eq!(file.alignment(), 64);
    assert_eq!(file.data_offset() % 64, 0);
    let n = file.tensor("n").expect("n");
    assert_eq!(n.offset, file.data_offset() + 128);
}

/// The first bytes of the real model (its whole header and some data), or
/// `None` when the model is missing.
fn model_prefix(len: usize) -> Option<Vec<u8>> {
    let path = gguf_support::default_model_path();
    let Ok(file) = std::fs::File::open(&path) else {
        println!("SKIPPED: the model {} is missing", path.display());
        return None;
    };
    let mut prefix = Vec::new();
    file.take(len as u64)
        .read_to_end(&mut prefix)
        .expect("read the model");
    Some(prefix)
}

/// Offset of the u64 that follows `key`'s name and type in a header.
fn after_key(bytes: &[u8], key: &str) -> usize {
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_bytes())
        .unwrap_or_else(|| panic!("key {key} not in the header"));
    at + key.len() + 4
}

#[test]
fn truncated_model_headers_are_errors() {
    let Some(prefix) = model_prefix(7 << 20) else {
        return;
    };
    let mut cuts: Vec<usize> = (0..200).collect();
    let mut len = 200usize;
    while len < prefix.len() {
        cuts.push(len);
        len = len * 5 / 4 + 7;
    }
    cuts.push(prefix.len());
    for cut in cuts {
        let e = open_err("model-cut.gguf", &prefix[..cut]);
        assert!(
            matches!(
                e.problem,
                GgufProblem::Truncated { .. }
                    | GgufProblem::CountTooLarge { .. }
                    | GgufProblem::TensorPastEnd { .. }
            ),
            "cut at {cut}: {e}"
        );
    }
}

#[test]
fn mutated_model_headers_are_errors() {
    let Some(prefix) = model_prefix(7 << 20) else {
        return;
    };
    let with = |at: usize, value: u64| {
        let mut bytes = prefix.clone();
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        bytes
    };
    let e = open_err("model-tensors.gguf", &with(8, 1 << 62));
    assert!(
        message(&e).contains("the tensor count is 4611686018427387904"),
        "{e}"
    );
    let e = open_err("model-kv.gguf", &with(16, u64::MAX));
    assert!(
        message(&e).contains("the metadata count is 18446744073709551615"),
        "{e}"
    );
    let e = open_err("model-key.gguf", &with(24, 1 << 50));
    assert!(
        message(&e).contains("a metadata key needs 1125899906842624 bytes"),
        "{e}"
    );
    let tokens = after_key(&prefix, "tokenizer.ggml.tokens") + 4;
    let e = open_err("model-tokens.gguf", &with(tokens, 1 << 40));
    assert!(
        message(&e).contains("the length of metadata 'tokenizer.ggml.tokens' is 1099511627776"),
        "{e}"
    );
    let first_token = tokens + 8;
    let e = open_err("model-token.gguf", &with(first_token, u64::MAX - 1));
    assert!(matches!(e.problem, GgufProblem::Truncated { .. }), "{e}");
    assert!(
        message(&e).contains("metadata 'tokenizer.ggml.tokens' needs"),
        "{e}"
    );
    // The whole header is intact here: the first tensor past the prefix fails.
    let e = open_err("model-prefix.gguf", &prefix);
    assert!(
        message(&e).contains("tensor 'token_embd.weight' needs 178257920 bytes"),
        "{e}"
    );
}
