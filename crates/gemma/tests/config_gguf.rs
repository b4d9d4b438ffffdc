//! `Gemma3Config` from GGUF metadata: the real default model (values read
//! with the `gguf` Python package) and synthetic files for the rules llama.cpp
//! applies where GGUF is silent.

mod gguf_support;

use std::path::Path;

use gemma::config::Gemma3Config;
use gemma::gguf::{GgufFile, GgufValue};
use gemma::quant::GgufDtype;
use gguf_support::{open_bytes, Builder};

#[test]
fn default_model_config() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/model/gemma-3-270m-q4_k_m.gguf");
    if !path.exists() {
        println!("SKIPPED: the default model {} is missing", path.display());
        return;
    }
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let c = Gemma3Config::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"));
    // gguf-py: gemma3.block_count 18, embedding_length 640, feed_forward_length 2048,
    // head_count 4, head_count_kv 1, key_length 256, sliding_window 512,
    // context_length 32768, rope.freq_base 1e6, eps 1e-6 (f32), 262144 tokens,
    // bos 2, eos 1, padding 0, no output.weight tensor.
    assert_eq!(c.vocab_size, 262_144);
    assert_eq!(c.hidden_size, 640);
    assert_eq!(c.intermediate_size, 2048);
    assert_eq!(c.num_hidden_layers, 18);
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (4, 1, 256)
    );
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(
        (c.rope_theta, c.rope_local_base_freq, c.rope_scaling),
        (1e6, 1e4, None)
    );
    assert_eq!((c.sliding_window, c.sliding_window_pattern), (512, 6));
    assert_eq!(c.query_pre_attn_scalar, 256.0);
    assert_eq!(c.max_position_embeddings, 32_768);
    assert_eq!(
        (c.final_logit_softcapping, c.attn_logit_softcapping),
        (None, None)
    );
    assert!(c.tie_word_embeddings);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.as_slice(), c.pad_token_id),
        (2, &[1][..], 0)
    );
    assert_eq!(c.quantization, None);
    // And it agrees with the published 270M config.json on everything the
    // forward pass uses.
    let json = Gemma3Config::from_json_file(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config/gemma3-270m.json"),
    )
    .expect("270m config");
    assert_eq!(
        Gemma3Config {
            eos_token_ids: json.eos_token_ids.clone(),
            ..c
        },
        json,
        "only the eos list differs (the GGUF names one eos token)"
    );
}

/// A GGUF with Gemma 3 metadata for the given shape and extra keys.
fn synthetic(
    layers: u32,
    hidden: u32,
    heads: u32,
    kv: u32,
    head_dim: u32,
    extra: Vec<(&str, GgufValue)>,
) -> Builder {
    let mut b = Builder::default()
        .meta("general.architecture", GgufValue::String("gemma3".into()))
        .meta("gemma3.context_length", GgufValue::U32(131_072))
        .meta("gemma3.embedding_length", GgufValue::U32(hidden))
        .meta("gemma3.block_count", GgufValue::U32(layers))
        .meta("gemma3.feed_forward_length", GgufValue::U32(hidden * 4))
        .meta("gemma3.attention.head_count", GgufValue::U32(heads))
        .meta("gemma3.attention.head_count_kv", GgufValue::U32(kv))
        .meta("gemma3.attention.key_length", GgufValue::U32(head_dim))
        .meta("gemma3.attention.value_length", GgufValue::U32(head_dim))
        .meta(
            "gemma3.attention.layer_norm_rms_epsilon",
            GgufValue::F32(1e-6),
        )
        .meta("gemma3.rope.freq_base", GgufValue::F32(1e6))
        .meta("gemma3.attention.sliding_window", GgufValue::U32(1024))
        .tensor(
            "token_embd.weight",
            &[32, 262_208],
            GgufDtype::Q8_0.id(),
            vec![0; 34 * 262_208],
        );
    for (key, value) in extra {
        b = b.meta(key, value);
    }
    b
}

fn config_of(name: &str, b: Builder) -> Result<Gemma3Config, String> {
    let (_dir, opened) = open_bytes(name, &b.build());
    let file = opened.map_err(|e| e.to_string())?;
    Gemma3Config::from_gguf(&file).map_err(|e| e.to_string())
}

#[test]
fn the_27b_shape_scales_attention_by_hidden_over_heads() {
    let c = config_of("27b.gguf", synthetic(62, 5376, 32, 16, 128, vec![])).expect("27b");
    assert_eq!((c.head_dim, c.query_pre_attn_scalar), (128, 168.0));
    assert_eq!(c.vocab_size, 262_208, "vocab from token_embd rows");
    let c = config_of("4b.gguf", synthetic(34, 2560, 8, 4, 256, vec![])).expect("4b");
    assert_eq!(c.query_pre_attn_scalar, 256.0, "head_dim elsewhere");
}

#[test]
fn linear_rope_scaling_eot_token_and_untied_output() {
    let extra = vec![
        (
            "gemma3.rope.scaling.type",
            GgufValue::String("linear".into()),
        ),
        ("gemma3.rope.scaling.factor", GgufValue::F32(8.0)),
        ("tokenizer.ggml.eos_token_id", GgufValue::U32(1)),
        ("tokenizer.ggml.eot_token_id", GgufValue::U32(106)),
    ];
    let b = synthetic(34, 2560, 8, 4, 256, extra).tensor(
        "output.weight",
        &[32, 4],
        GgufDtype::Q8_0.id(),
        vec![0; 34 * 4],
    );
    let c = config_of("rope.gguf", b).expect("4b");
    assert_eq!(c.rope_scaling, Some(8.0));
    assert!(
        !c.tie_word_embeddings,
        "a separate output.weight unties the projection"
    );
    assert_eq!(c.eos_token_ids, vec![1, 106]);
    let yarn = vec![("gemma3.rope.scaling.type", GgufValue::String("yarn".into()))];
    let e = config_of("yarn.gguf", synthetic(34, 2560, 8, 4, 256, yarn)).expect_err("yarn");
    assert!(
        e.contains("yarn.gguf: field 'gemma3.rope.scaling.type' is \"yarn\""),
        "{e}"
    );
}

#[test]
fn bad_gguf_metadata_names_the_file_and_key() {
    let mut b = synthetic(18, 640, 4, 1, 256, vec![]);
    b.entries
        .retain(|e| !matches!(e, gguf_support::Entry::Value(k, _) if k == "gemma3.block_count"));
    let e = config_of("noblocks.gguf", b).expect_err("missing block_count");
    assert!(
        e.contains("noblocks.gguf: missing field 'gemma3.block_count'"),
        "{e}"
    );

    let mut b = synthetic(18, 640, 4, 1, 256, vec![]);
    b.entries
        .retain(|e| !matches!(e, gguf_support::Entry::Value(k, _) if k == "gemma3.context_length"));
    let b = b.meta("gemma3.context_length", GgufValue::String("long".into()));
    let e = config_of("ctx.gguf", b).expect_err("string context");
    assert!(e.contains("field 'gemma3.context_length' is string"), "{e}");

    let b = Builder::default().meta("general.architecture", GgufValue::String("llama".into()));
    let e = config_of("llama.gguf", b).expect_err("not gemma3");
    assert!(
        e.contains("llama.gguf: field 'general.architecture' is \"llama\""),
        "{e}"
    );
}
