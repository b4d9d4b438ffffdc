//! `Gemma3Config` from `config.json`: every published size, the multimodal
//! wrapper, MLX quantization, and broken files. Expected values are the
//! published hyperparameters, checked against mlx-lm 0.32.2's `ModelArgs`.

use std::path::{Path, PathBuf};

use gemma::config::{ConfigProblem, Gemma3Config, LayerQuantization};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config")
        .join(name)
}

fn load(name: &str) -> Gemma3Config {
    Gemma3Config::from_json_file(&fixture(name)).unwrap_or_else(|e| panic!("{e}"))
}

/// (layers, hidden, intermediate, heads, kv heads, head_dim, window, query_pre_attn_scalar, vocab, max positions, rope factor)
type Shape = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    f32,
    usize,
    usize,
    Option<f32>,
);

fn shape(c: &Gemma3Config) -> Shape {
    (
        c.num_hidden_layers,
        c.hidden_size,
        c.intermediate_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.sliding_window,
        c.query_pre_attn_scalar,
        c.vocab_size,
        c.max_position_embeddings,
        c.rope_scaling,
    )
}

#[test]
fn published_sizes_have_their_hyperparameters() {
    let cases: [(&str, Shape); 5] = [
        (
            "gemma3-270m.json",
            (18, 640, 2048, 4, 1, 256, 512, 256.0, 262_144, 32_768, None),
        ),
        (
            "gemma3-1b.json",
            (26, 1152, 6912, 4, 1, 256, 512, 256.0, 262_144, 32_768, None),
        ),
        (
            "gemma3-4b.json",
            (
                34,
                2560,
                10240,
                8,
                4,
                256,
                1024,
                256.0,
                262_208,
                131_072,
                Some(8.0),
            ),
        ),
        (
            "gemma3-12b.json",
            (
                48,
                3840,
                15360,
                16,
                8,
                256,
                1024,
                256.0,
                262_208,
                131_072,
                Some(8.0),
            ),
        ),
        (
            "gemma3-27b.json",
            (
                62,
                5376,
                21504,
                32,
                16,
                128,
                1024,
                168.0,
                262_208,
                131_072,
                Some(8.0),
            ),
        ),
    ];
    for (name, expected) in cases {
        let c = load(name);
        assert_eq!(shape(&c), expected, "{name}");
        assert_eq!(c.rms_norm_eps, 1e-6, "{name}");
        assert_eq!((c.rope_theta, c.rope_local_base_freq), (1e6, 1e4), "{name}");
        assert_eq!(c.sliding_window_pattern, 6, "{name}");
        assert_eq!(
            (c.final_logit_softcapping, c.attn_logit_softcapping),
            (None, None),
            "{name}"
        );
        assert!(c.tie_word_embeddings, "{name}");
        assert_eq!(
            (c.bos_token_id, c.eos_token_ids.as_slice(), c.pad_token_id),
            (2, &[1, 106][..], 0),
            "{name}"
        );
        assert_eq!(c.quantization, None, "{name}");
    }
}

#[test]
fn multimodal_wrapper_reads_text_config_with_mlx_lm_defaults() {
    // mlx-lm's gemma3.ModelArgs: vocab 262208, 8 heads, 4 kv heads; the rest
    // from gemma3_text.ModelArgs (head_dim 256, 32768 positions, ...).
    let c = load("gemma3-4b-multimodal.json");
    assert_eq!(
        shape(&c),
        (
            34,
            2560,
            10240,
            8,
            4,
            256,
            1024,
            256.0,
            262_208,
            32_768,
            Some(8.0)
        )
    );
    assert_eq!(
        c.eos_token_ids,
        vec![1, 106],
        "eos ids come from the wrapper's top level"
    );
    let c = load("gemma3-27b-multimodal.json");
    assert_eq!(
        shape(&c),
        (
            62,
            5376,
            21504,
            32,
            16,
            128,
            1024,
            168.0,
            262_208,
            32_768,
            Some(8.0)
        )
    );
}

#[test]
fn sliding_layers_and_attention_scale() {
    let c = load("gemma3-270m.json");
    let global: Vec<usize> = (0..c.num_hidden_layers)
        .filter(|&i| !c.is_sliding(i))
        .collect();
    assert_eq!(global, vec![5, 11, 17]);
    assert_eq!(c.attention_scale(), 0.0625);
    let c = load("gemma3-27b.json");
    // 168^-0.5 = 0.07715167498104596 in f64, as mlx-lm computes it in Python.
    assert_eq!(c.attention_scale(), 0.077_151_674_981_045_96_f64 as f32);
}

#[test]
fn mlx_quantization_block() {
    let c = load("gemma3-270m-mlx-4bit.json");
    let q = c.quantization.expect("quantization block");
    assert_eq!((q.group_size, q.bits, q.mode.as_str()), (64, 4, "affine"));
    assert_eq!(
        q.overrides.get("model.embed_tokens"),
        Some(&Some(LayerQuantization {
            group_size: 32,
            bits: 8
        }))
    );
    assert_eq!(q.overrides.get("model.layers.0.mlp.down_proj"), Some(&None));
    assert_eq!(q.overrides.len(), 2);
    assert_eq!(c.eos_token_ids, vec![1]);
}

#[test]
fn empty_text_config_takes_defaults() {
    let c = Gemma3Config::from_json_str(r#"{"model_type": "gemma3_text"}"#, Path::new("c.json"))
        .expect("parse");
    assert_eq!(
        shape(&c),
        (26, 1152, 6912, 4, 1, 256, 512, 256.0, 262_144, 32_768, None)
    );
    assert!(c.tie_word_embeddings);
}

/// Parses `text` and returns the error message, which must name the file.
fn error_of(text: &str) -> (ConfigProblem, String) {
    let path = Path::new("/models/broken/config.json");
    let e = Gemma3Config::from_json_str(text, path).expect_err("the config is broken");
    let message = e.to_string();
    assert!(
        message.starts_with("/models/broken/config.json: "),
        "{message}"
    );
    (e.problem, message)
}

#[test]
fn broken_configs_name_the_file_and_field() {
    let cases: [(&str, &str); 12] = [
        ("{ not json", "not valid JSON"),
        ("[1, 2]", "field '(root)' is an array"),
        (
            r#"{"hidden_size": 640}"#,
            "field 'model_type' is \"(absent)\", expected one of",
        ),
        (
            r#"{"model_type": "llama"}"#,
            "field 'model_type' is \"llama\"",
        ),
        (r#"{"model_type": "gemma3"}"#, "missing field 'text_config'"),
        (
            r#"{"model_type": "gemma3_text", "hidden_size": "640"}"#,
            "field 'hidden_size' is a string (\"640\"), expected a non-negative integer",
        ),
        (
            r#"{"model_type": "gemma3_text", "num_hidden_layers": -3}"#,
            "field 'num_hidden_layers' is a number (-3)",
        ),
        (
            r#"{"model_type": "gemma3_text", "rms_norm_eps": true}"#,
            "field 'rms_norm_eps' is a boolean (true), expected a number",
        ),
        (
            r#"{"model_type": "gemma3", "text_config": {"head_dim": 2.5}}"#,
            "field 'text_config.head_dim' is a number (2.5)",
        ),
        (
            r#"{"model_type": "gemma3_text", "rope_scaling": {"rope_type": "yarn", "factor": 8}}"#,
            "field 'rope_scaling.rope_type' is \"yarn\": Gemma 3 uses only linear RoPE scaling",
        ),
        (
            r#"{"model_type": "gemma3_text", "rope_scaling": {"type": "linear"}}"#,
            "missing field 'rope_scaling.factor'",
        ),
        (
            r#"{"model_type": "gemma3_text", "quantization": {"bits": 4}}"#,
            "missing field 'quantization.group_size'",
        ),
    ];
    for (text, expected) in cases {
        let (_, message) = error_of(text);
        assert!(
            message.contains(expected),
            "{text}\n  gave: {message}\n  expected to contain: {expected}"
        );
    }
}

#[test]
fn inconsistent_values_are_rejected() {
    let (problem, message) = error_of(
        r#"{"model_type": "gemma3_text", "num_attention_heads": 4, "num_key_value_heads": 3}"#,
    );
    assert!(
        matches!(problem, ConfigProblem::BadValue { .. }),
        "{message}"
    );
    assert!(
        message.contains("'num_key_value_heads' is 3: must divide num_attention_heads (4)"),
        "{message}"
    );
    let (_, message) = error_of(r#"{"model_type": "gemma3_text", "sliding_window_pattern": 0}"#);
    assert!(
        message.contains("'sliding_window_pattern' is 0: must be at least 1"),
        "{message}"
    );
    let (_, message) = error_of(
        r#"{"model_type": "gemma3_text", "rope_scaling": {"rope_type": "linear", "factor": -8}}"#,
    );
    assert!(message.contains("'rope_scaling.factor' is -8"), "{message}");
}

#[test]
fn missing_file_names_the_path() {
    let e =
        Gemma3Config::from_json_file(Path::new("/nonexistent/config.json")).expect_err("missing");
    assert!(
        e.to_string()
            .starts_with("/nonexistent/config.json: cannot read the file"),
        "{e}"
    );
}
