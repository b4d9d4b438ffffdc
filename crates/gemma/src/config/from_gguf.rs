//! [`Gemma3Config`] from the metadata of a GGUF file (architecture `gemma3`).
//!
//! Where the metadata is silent, values follow llama.cpp's Gemma 3 loader
//! (`llama-model.cpp`) and Gemma 3's published configuration:
//! - `head_dim`: `attention.key_length`, else hidden / heads;
//! - `query_pre_attn_scalar`: `head_dim`, except for the 27B shape (62
//!   layers), where it is hidden / heads (168), as llama.cpp hard-codes;
//! - RoPE base of sliding layers: `rope.freq_base_swa`, else 10000; global
//!   base: `rope.freq_base`, else Gemma 3's 1e6;
//! - sliding-window pattern: `attention.sliding_window_pattern`, else 6;
//! - vocabulary: rows of `token_embd.weight` (the matrix the forward pass
//!   uses), else the length of `tokenizer.ggml.tokens`;
//! - tied output: no `output.weight` tensor;
//! - RoPE scaling: `rope.scaling.type` `linear` (or absent) with a nonzero
//!   `rope.scaling.factor`, applied to global layers only.

use crate::gguf::{GgufFile, GgufValue};

use super::defaults as d;
use super::{ConfigError, ConfigProblem, Gemma3Config};

/// The architecture name GGUF files give Gemma 3.
const ARCHITECTURE: &str = "gemma3";
/// Layer count of Gemma 3 27B, whose attention scale llama.cpp special-cases.
const LAYERS_27B: usize = 62;

impl Gemma3Config {
    /// Reads the hyperparameters from a GGUF file's metadata and tensor list.
    pub fn from_gguf(file: &GgufFile) -> Result<Gemma3Config, ConfigError> {
        parse(file).map_err(|problem| ConfigError {
            path: file.path().to_path_buf(),
            problem,
        })
    }
}

fn parse(file: &GgufFile) -> Result<Gemma3Config, ConfigProblem> {
    let m = Metadata { file };
    let arch_key = "general.architecture";
    match m.string(arch_key)? {
        Some(ARCHITECTURE) => {}
        other => {
            return Err(ConfigProblem::NotGemma3 {
                field: "general.architecture",
                found: other.unwrap_or("(absent)").to_string(),
                expected: "\"gemma3\"",
            })
        }
    }
    let key = |name: &str| format!("{ARCHITECTURE}.{name}");

    let hidden_size = m.required_usize(&key("embedding_length"))?;
    let num_hidden_layers = m.required_usize(&key("block_count"))?;
    let num_attention_heads = m.required_usize(&key("attention.head_count"))?;
    if num_attention_heads == 0 {
        return Err(ConfigProblem::BadValue {
            field: key("attention.head_count"),
            value: "0".to_string(),
            reason: "must be at least 1".to_string(),
        });
    }
    let head_dim = m
        .usize(&key("attention.key_length"))?
        .unwrap_or(hidden_size / num_attention_heads);
    if let Some(value_length) = m.usize(&key("attention.value_length"))? {
        if value_length != head_dim {
            return Err(ConfigProblem::BadValue {
                field: key("attention.value_length"),
                value: value_length.to_string(),
                reason: format!("Gemma 3 uses the key length ({head_dim}) for values too"),
            });
        }
    }
    let query_pre_attn_scalar = if num_hidden_layers == LAYERS_27B {
        (hidden_size / num_attention_heads) as f32
    } else {
        head_dim as f32
    };

    let config = Gemma3Config {
        vocab_size: vocab_size(file)?,
        hidden_size,
        intermediate_size: m.required_usize(&key("feed_forward_length"))?,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads: m
            .usize(&key("attention.head_count_kv"))?
            .unwrap_or(num_attention_heads),
        head_dim,
        rms_norm_eps: m
            .f32(&key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| ConfigProblem::Missing(key("attention.layer_norm_rms_epsilon")))?,
        rope_theta: m.f32(&key("rope.freq_base"))?.unwrap_or(d::ROPE_THETA),
        rope_local_base_freq: m
            .f32(&key("rope.freq_base_swa"))?
            .unwrap_or(d::ROPE_LOCAL_BASE_FREQ),
        rope_scaling: rope_scaling(&m, &key("rope.scaling.type"), &key("rope.scaling.factor"))?,
        sliding_window: m.required_usize(&key("attention.sliding_window"))?,
        sliding_window_pattern: m
            .usize(&key("attention.sliding_window_pattern"))?
            .unwrap_or(d::SLIDING_WINDOW_PATTERN),
        query_pre_attn_scalar,
        max_position_embeddings: m.required_usize(&key("context_length"))?,
        final_logit_softcapping: m.f32(&key("final_logit_softcapping"))?,
        attn_logit_softcapping: m.f32(&key("attn_logit_softcapping"))?,
        tie_word_embeddings: file.tensor("output.weight").is_none(),
        bos_token_id: m
            .u32("tokenizer.ggml.bos_token_id")?
            .unwrap_or(d::BOS_TOKEN_ID),
        eos_token_ids: eos_token_ids(&m)?,
        pad_token_id: m
            .u32("tokenizer.ggml.padding_token_id")?
            .unwrap_or(d::PAD_TOKEN_ID),
        quantization: None,
    };
    config.validate()?;
    Ok(config)
}

/// Rows of the embedding matrix, or the tokenizer's vocabulary size.
fn vocab_size(file: &GgufFile) -> Result<usize, ConfigProblem> {
    if let Some(embd) = file.tensor("token_embd.weight") {
        let rows = embd.shape.get(1).copied().unwrap_or(1);
        return usize::try_from(rows).map_err(|_| ConfigProblem::BadValue {
            field: "token_embd.weight".to_string(),
            value: format!("shape {:?}", embd.shape),
            reason: "too many rows".to_string(),
        });
    }
    match file
        .get("tokenizer.ggml.tokens")
        .and_then(GgufValue::as_array)
    {
        Some(tokens) => Ok(tokens.len()),
        None => Err(ConfigProblem::Missing(
            "token_embd.weight or tokenizer.ggml.tokens".to_string(),
        )),
    }
}

/// The end-of-sequence token and, when present and different, the end-of-turn token.
fn eos_token_ids(m: &Metadata) -> Result<Vec<u32>, ConfigProblem> {
    let mut ids = vec![m
        .u32("tokenizer.ggml.eos_token_id")?
        .unwrap_or(d::EOS_TOKEN_ID)];
    if let Some(eot) = m.u32("tokenizer.ggml.eot_token_id")? {
        if !ids.contains(&eot) {
            ids.push(eot);
        }
    }
    Ok(ids)
}

/// Linear RoPE scaling of global layers, or `None`.
fn rope_scaling(
    m: &Metadata,
    type_key: &str,
    factor_key: &str,
) -> Result<Option<f32>, ConfigProblem> {
    let factor = m.f32(factor_key)?.filter(|&f| f != 0.0);
    match (m.string(type_key)?, factor) {
        (Some("none"), _) | (None | Some("linear"), None) => Ok(None),
        (None | Some("linear"), Some(factor)) => Ok(Some(factor)),
        (Some(other), _) => Err(ConfigProblem::BadValue {
            field: type_key.to_string(),
            value: format!("\"{other}\""),
            reason: "Gemma 3 uses only linear RoPE scaling".to_string(),
        }),
    }
}

/// Typed access to a GGUF file's metadata, with errors naming the key.
struct Metadata<'a> {
    file: &'a GgufFile,
}

impl<'a> Metadata<'a> {
    fn wrong_type(key: &str, value: &GgufValue, expected: &'static str) -> ConfigProblem {
        ConfigProblem::WrongType {
            field: key.to_string(),
            found: format!("{} ({value:?})", value.type_name()),
            expected,
        }
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>, ConfigProblem> {
        self.file
            .get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| Self::wrong_type(key, v, "a string"))
            })
            .transpose()
    }

    fn usize(&self, key: &str) -> Result<Option<usize>, ConfigProblem> {
        self.file
            .get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| Self::wrong_type(key, v, "a non-negative integer"))
            })
            .transpose()
    }

    fn required_usize(&self, key: &str) -> Result<usize, ConfigProblem> {
        self.usize(key)?
            .ok_or_else(|| ConfigProblem::Missing(key.to_string()))
    }

    fn u32(&self, key: &str) -> Result<Option<u32>, ConfigProblem> {
        self.file
            .get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| Self::wrong_type(key, v, "an integer from 0 to 4294967295"))
            })
            .transpose()
    }

    fn f32(&self, key: &str) -> Result<Option<f32>, ConfigProblem> {
        self.file
            .get(key)
            .map(|v| match v {
                GgufValue::F32(x) => Ok(*x),
                GgufValue::F64(x) => Ok(*x as f32),
                other => Err(Self::wrong_type(key, other, "a float")),
            })
            .transpose()
    }
}
