//! [`Gemma3Config`] from a Hugging Face / MLX `config.json`.
//!
//! `model_type` `gemma3_text` holds the fields at the top level; `gemma3` (the
//! multimodal wrapper) holds them under `text_config`, with the vocabulary
//! size, token ids, tying and quantization read from the top level when the
//! text config lacks them. A JSON `null` counts as absent.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::defaults as d;
use super::{ConfigError, ConfigProblem, Gemma3Config, LayerQuantization, QuantizationConfig};

type Object = Map<String, Value>;

impl Gemma3Config {
    /// Reads a `config.json` file.
    pub fn from_json_file(path: &Path) -> Result<Gemma3Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_path_buf(),
            problem: ConfigProblem::Io(e),
        })?;
        Gemma3Config::from_json_str(&text, path)
    }

    /// Parses the text of a `config.json`; `path` names it in errors.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Gemma3Config, ConfigError> {
        parse(text).map_err(|problem| ConfigError {
            path: path.to_path_buf(),
            problem,
        })
    }
}

fn parse(text: &str) -> Result<Gemma3Config, ConfigProblem> {
    let root: Value = serde_json::from_str(text)?;
    let root = Fields::new(&root, "")?;
    let model_type = root.string("model_type")?;
    let config = match model_type.as_deref() {
        Some("gemma3_text") => text_config(&root, &root, TextDefaults::TEXT)?,
        Some("gemma3") => {
            let Some(inner) = root.get("text_config") else {
                return Err(ConfigProblem::Missing("text_config".to_string()));
            };
            let inner = Fields::new(inner, "text_config.")?;
            let mut config = text_config(&inner, &root, TextDefaults::WRAPPED)?;
            config.vocab_size = root.usize_or("vocab_size", d::WRAPPED_VOCAB_SIZE)?;
            config
        }
        other => {
            return Err(ConfigProblem::NotGemma3 {
                field: "model_type",
                found: other.unwrap_or("(absent)").to_string(),
                expected: "\"gemma3_text\", \"gemma3\"",
            })
        }
    };
    config.validate()?;
    Ok(config)
}

/// Defaults that differ between `gemma3_text` and the `gemma3` wrapper.
struct TextDefaults {
    num_attention_heads: usize,
    num_key_value_heads: usize,
}

impl TextDefaults {
    const TEXT: TextDefaults = TextDefaults {
        num_attention_heads: d::NUM_ATTENTION_HEADS,
        num_key_value_heads: d::NUM_KEY_VALUE_HEADS,
    };
    const WRAPPED: TextDefaults = TextDefaults {
        num_attention_heads: d::WRAPPED_NUM_ATTENTION_HEADS,
        num_key_value_heads: d::WRAPPED_NUM_KEY_VALUE_HEADS,
    };
}

/// Reads the text model's fields from `f`; `outer` supplies the fields a
/// wrapper keeps at its top level (it is `f` itself for `gemma3_text`).
fn text_config(
    f: &Fields,
    outer: &Fields,
    defaults: TextDefaults,
) -> Result<Gemma3Config, ConfigProblem> {
    let either = |key: &str| if f.get(key).is_some() { f } else { outer };
    let eos = either("eos_token_id");
    Ok(Gemma3Config {
        vocab_size: f.usize_or("vocab_size", d::VOCAB_SIZE)?,
        hidden_size: f.usize_or("hidden_size", d::HIDDEN_SIZE)?,
        intermediate_size: f.usize_or("intermediate_size", d::INTERMEDIATE_SIZE)?,
        num_hidden_layers: f.usize_or("num_hidden_layers", d::NUM_HIDDEN_LAYERS)?,
        num_attention_heads: f.usize_or("num_attention_heads", defaults.num_attention_heads)?,
        num_key_value_heads: f.usize_or("num_key_value_heads", defaults.num_key_value_heads)?,
        head_dim: f.usize_or("head_dim", d::HEAD_DIM)?,
        rms_norm_eps: f.f32_or("rms_norm_eps", d::RMS_NORM_EPS)?,
        rope_theta: f.f32_or("rope_theta", d::ROPE_THETA)?,
        rope_local_base_freq: f.f32_or("rope_local_base_freq", d::ROPE_LOCAL_BASE_FREQ)?,
        rope_scaling: rope_scaling(f)?,
        sliding_window: f.usize_or("sliding_window", d::SLIDING_WINDOW)?,
        sliding_window_pattern: f.usize_or("sliding_window_pattern", d::SLIDING_WINDOW_PATTERN)?,
        query_pre_attn_scalar: f.f32_or("query_pre_attn_scalar", d::QUERY_PRE_ATTN_SCALAR)?,
        max_position_embeddings: f
            .usize_or("max_position_embeddings", d::MAX_POSITION_EMBEDDINGS)?,
        final_logit_softcapping: f.f32("final_logit_softcapping")?,
        attn_logit_softcapping: f.f32("attn_logit_softcapping")?,
        tie_word_embeddings: either("tie_word_embeddings").bool_or("tie_word_embeddings", true)?,
        bos_token_id: either("bos_token_id").u32_or("bos_token_id", d::BOS_TOKEN_ID)?,
        eos_token_ids: eos.u32_list_or("eos_token_id", d::EOS_TOKEN_ID)?,
        pad_token_id: either("pad_token_id").u32_or("pad_token_id", d::PAD_TOKEN_ID)?,
        quantization: quantization(either("quantization"))?,
    })
}

/// `rope_scaling`: absent, `null` or type `default` mean none; `linear` needs a `factor`.
fn rope_scaling(f: &Fields) -> Result<Option<f32>, ConfigProblem> {
    let Some(value) = f.get("rope_scaling") else {
        return Ok(None);
    };
    let scaling = Fields::new(value, &format!("{}rope_scaling.", f.prefix))?;
    let kind_key = if scaling.get("rope_type").is_some() {
        "rope_type"
    } else {
        "type"
    };
    match scaling.string(kind_key)?.as_deref() {
        Some("linear") => match scaling.f32("factor")? {
            Some(factor) => Ok(Some(factor)),
            None => Err(ConfigProblem::Missing(scaling.name("factor"))),
        },
        Some("default") => Ok(None),
        Some(other) => Err(ConfigProblem::BadValue {
            field: scaling.name(kind_key),
            value: format!("\"{other}\""),
            reason: "Gemma 3 uses only linear RoPE scaling".to_string(),
        }),
        None => Err(ConfigProblem::Missing(scaling.name("rope_type"))),
    }
}

/// The MLX `quantization` block: `group_size`, `bits`, optional `mode`, and
/// per-module overrides (an object with `group_size`/`bits`, or `false`).
fn quantization(f: &Fields) -> Result<Option<QuantizationConfig>, ConfigProblem> {
    let Some(value) = f.get("quantization") else {
        return Ok(None);
    };
    let q = Fields::new(value, &format!("{}quantization.", f.prefix))?;
    let default = layer_quantization(&q)?;
    let mut overrides = BTreeMap::new();
    for (key, value) in q.object {
        match value {
            Value::Object(_) => {
                let layer = Fields::new(value, &format!("{}{key}.", q.prefix))?;
                overrides.insert(key.clone(), Some(layer_quantization(&layer)?));
            }
            Value::Bool(false) => {
                overrides.insert(key.clone(), None);
            }
            _ => {}
        }
    }
    Ok(Some(QuantizationConfig {
        group_size: default.group_size,
        bits: default.bits,
        mode: q.string("mode")?.unwrap_or_else(|| "affine".to_string()),
        overrides,
    }))
}

fn layer_quantization(f: &Fields) -> Result<LayerQuantization, ConfigProblem> {
    let required = |key: &str| match f.u32(key)? {
        Some(v) if v > 0 => Ok(v),
        Some(v) => Err(ConfigProblem::BadValue {
            field: f.name(key),
            value: v.to_string(),
            reason: "must be at least 1".to_string(),
        }),
        None => Err(ConfigProblem::Missing(f.name(key))),
    };
    Ok(LayerQuantization {
        group_size: required("group_size")?,
        bits: required("bits")?,
    })
}

/// A JSON object and the dotted path it sits at, for typed field access with
/// error messages that name the field.
struct Fields<'a> {
    object: &'a Object,
    prefix: String,
}

impl<'a> Fields<'a> {
    fn new(value: &'a Value, prefix: &str) -> Result<Fields<'a>, ConfigProblem> {
        match value {
            Value::Object(object) => Ok(Fields {
                object,
                prefix: prefix.to_string(),
            }),
            other => Err(ConfigProblem::WrongType {
                field: match prefix.trim_end_matches('.') {
                    "" => "(root)".to_string(),
                    name => name.to_string(),
                },
                found: describe(other),
                expected: "an object",
            }),
        }
    }

    /// The full dotted name of `key`.
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The value of `key`, treating `null` as absent.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.object.get(key).filter(|v| !v.is_null())
    }

    fn wrong_type(&self, key: &str, value: &Value, expected: &'static str) -> ConfigProblem {
        ConfigProblem::WrongType {
            field: self.name(key),
            found: describe(value),
            expected,
        }
    }

    fn string(&self, key: &str) -> Result<Option<String>, ConfigProblem> {
        self.get(key)
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(self.wrong_type(key, other, "a string")),
            })
            .transpose()
    }

    fn u64(&self, key: &str) -> Result<Option<u64>, ConfigProblem> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.wrong_type(key, v, "a non-negative integer"))
            })
            .transpose()
    }

    fn u32(&self, key: &str) -> Result<Option<u32>, ConfigProblem> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| self.wrong_type(key, v, "an integer from 0 to 4294967295"))
            })
            .transpose()
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize, ConfigProblem> {
        match self.u64(key)? {
            None => Ok(default),
            Some(v) => usize::try_from(v).map_err(|_| ConfigProblem::BadValue {
                field: self.name(key),
                value: v.to_string(),
                reason: "too large".to_string(),
            }),
        }
    }

    fn u32_or(&self, key: &str, default: u32) -> Result<u32, ConfigProblem> {
        Ok(self.u32(key)?.unwrap_or(default))
    }

    /// A number (integer or float), narrowed to f32.
    fn f32(&self, key: &str) -> Result<Option<f32>, ConfigProblem> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| self.wrong_type(key, v, "a number"))
            })
            .transpose()
    }

    fn f32_or(&self, key: &str, default: f32) -> Result<f32, ConfigProblem> {
        Ok(self.f32(key)?.unwrap_or(default))
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, ConfigProblem> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(self.wrong_type(key, other, "true or false")),
        }
    }

    /// One token id or a list of them.
    fn u32_list_or(&self, key: &str, default: u32) -> Result<Vec<u32>, ConfigProblem> {
        let expected = "a token id or a list of token ids";
        let id = |v: &Value| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.wrong_type(key, v, expected))
        };
        match self.get(key) {
            None => Ok(vec![default]),
            Some(Value::Array(items)) => items.iter().map(id).collect(),
            Some(v) => Ok(vec![id(v)?]),
        }
    }
}

/// A short description of a JSON value for error messages.
fn describe(value: &Value) -> String {
    let text = value.to_string();
    let kind = match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    if text.len() <= 40 {
        format!("{kind} ({text})")
    } else {
        kind.to_string()
    }
}
