//! Gemma 3 text model hyperparameters, read from a Hugging Face / MLX
//! `config.json` ([`Gemma3Config::from_json_file`]) or from GGUF metadata
//! ([`Gemma3Config::from_gguf`]).
//!
//! Fields a `config.json` leaves out take mlx-lm's defaults (`ModelArgs` in
//! `mlx_lm/models/gemma3_text.py` and, for the multimodal `gemma3` wrapper,
//! `gemma3.py`), because mlx-lm is the implementation we must match; they are
//! the constants below. Fields mlx-lm does not model (token ids, tying,
//! soft-capping) take transformers' `Gemma3TextConfig` defaults.

mod from_gguf;
mod from_json;
mod published;

pub use published::PUBLISHED_SIZES;

use std::collections::BTreeMap;
use std::path::PathBuf;

/// mlx-lm's defaults for fields a `config.json` leaves out (`gemma3_text.ModelArgs`).
pub mod defaults {
    /// Hidden size.
    pub const HIDDEN_SIZE: usize = 1152;
    /// Transformer blocks.
    pub const NUM_HIDDEN_LAYERS: usize = 26;
    /// MLP width.
    pub const INTERMEDIATE_SIZE: usize = 6912;
    /// Query heads (the `gemma3` wrapper uses [`WRAPPED_NUM_ATTENTION_HEADS`]).
    pub const NUM_ATTENTION_HEADS: usize = 4;
    /// Key/value heads (the `gemma3` wrapper uses [`WRAPPED_NUM_KEY_VALUE_HEADS`]).
    pub const NUM_KEY_VALUE_HEADS: usize = 1;
    /// Size of one attention head.
    pub const HEAD_DIM: usize = 256;
    /// RMSNorm epsilon.
    pub const RMS_NORM_EPS: f32 = 1e-6;
    /// Embedding rows (the `gemma3` wrapper uses [`WRAPPED_VOCAB_SIZE`]).
    pub const VOCAB_SIZE: usize = 262_144;
    /// RoPE base of global layers.
    pub const ROPE_THETA: f32 = 1_000_000.0;
    /// RoPE base of sliding-window layers.
    pub const ROPE_LOCAL_BASE_FREQ: f32 = 10_000.0;
    /// Attention scores are scaled by this to the power -1/2.
    pub const QUERY_PRE_ATTN_SCALAR: f32 = 256.0;
    /// Tokens a sliding-window layer attends to.
    pub const SLIDING_WINDOW: usize = 512;
    /// Every this-many-th layer is global.
    pub const SLIDING_WINDOW_PATTERN: usize = 6;
    /// Longest context.
    pub const MAX_POSITION_EMBEDDINGS: usize = 32_768;
    /// Embedding rows of the multimodal `gemma3` wrapper (mlx-lm `gemma3.ModelArgs`).
    pub const WRAPPED_VOCAB_SIZE: usize = 262_208;
    /// Query heads inside the `gemma3` wrapper (mlx-lm `gemma3.ModelArgs`).
    pub const WRAPPED_NUM_ATTENTION_HEADS: usize = 8;
    /// Key/value heads inside the `gemma3` wrapper (mlx-lm `gemma3.ModelArgs`).
    pub const WRAPPED_NUM_KEY_VALUE_HEADS: usize = 4;
    /// Beginning-of-sequence token (transformers).
    pub const BOS_TOKEN_ID: u32 = 2;
    /// End-of-sequence token (transformers).
    pub const EOS_TOKEN_ID: u32 = 1;
    /// Padding token (transformers).
    pub const PAD_TOKEN_ID: u32 = 0;
}

/// Every hyperparameter the Gemma 3 text forward pass needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3Config {
    /// Embedding rows (and logits per position).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the gated MLP.
    pub intermediate_size: usize,
    /// Number of transformer blocks.
    pub num_hidden_layers: usize,
    /// Query heads per layer.
    pub num_attention_heads: usize,
    /// Key/value heads per layer (grouped-query attention).
    pub num_key_value_heads: usize,
    /// Size of one attention head (queries, keys and values alike).
    pub head_dim: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f32,
    /// RoPE base of global layers.
    pub rope_theta: f32,
    /// RoPE base of sliding-window layers.
    pub rope_local_base_freq: f32,
    /// Linear RoPE scaling factor of global layers (positions are divided by
    /// it), or `None` for no scaling.
    pub rope_scaling: Option<f32>,
    /// Tokens a sliding-window layer attends to.
    pub sliding_window: usize,
    /// Every this-many-th layer is global; see [`Gemma3Config::is_sliding`].
    pub sliding_window_pattern: usize,
    /// Attention scores are scaled by this to the power -1/2; see [`Gemma3Config::attention_scale`].
    pub query_pre_attn_scalar: f32,
    /// Longest context the model was trained for.
    pub max_position_embeddings: usize,
    /// Soft cap of the final logits; no released Gemma 3 uses one.
    pub final_logit_softcapping: Option<f32>,
    /// Soft cap of attention scores; no released Gemma 3 uses one.
    pub attn_logit_softcapping: Option<f32>,
    /// Whether the output projection reuses the embedding matrix. A weight
    /// loader should also check for a separate output tensor, as mlx-lm does.
    pub tie_word_embeddings: bool,
    /// Beginning-of-sequence token id.
    pub bos_token_id: u32,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Padding token id.
    pub pad_token_id: u32,
    /// MLX affine quantization of the checkpoint's weights, if any.
    pub quantization: Option<QuantizationConfig>,
}

/// The `quantization` block of an MLX checkpoint's `config.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizationConfig {
    /// Weights sharing one scale and bias.
    pub group_size: u32,
    /// Bits per quantized weight.
    pub bits: u32,
    /// MLX quantization mode (`"affine"` unless the file says otherwise).
    pub mode: String,
    /// Per-module settings that differ from the default, by module path
    /// (e.g. `model.layers.0.mlp.down_proj`); `None` means left unquantized.
    pub overrides: BTreeMap<String, Option<LayerQuantization>>,
}

/// Quantization parameters of one module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerQuantization {
    /// Weights sharing one scale and bias.
    pub group_size: u32,
    /// Bits per quantized weight.
    pub bits: u32,
}

/// A configuration that could not be read; its message starts with the file's path.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct ConfigError {
    /// The `config.json` or GGUF file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: ConfigProblem,
}

/// What is wrong with a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigProblem {
    /// The file could not be read.
    #[error("cannot read the file: {0}")]
    Io(#[from] std::io::Error),
    /// The file is not valid JSON.
    #[error("not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A required field is absent and has no default.
    #[error("missing field '{0}'")]
    Missing(String),
    /// A field has the wrong JSON or GGUF type.
    #[error("field '{field}' is {found}, expected {expected}")]
    WrongType {
        /// The field (dotted path in JSON, metadata key in GGUF).
        field: String,
        /// What was found.
        found: String,
        /// What is needed.
        expected: &'static str,
    },
    /// A field has a value the model cannot use.
    #[error("field '{field}' is {value}: {reason}")]
    BadValue {
        /// The field (dotted path in JSON, metadata key in GGUF).
        field: String,
        /// The value found.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// `model_type` (or GGUF `general.architecture`) is not Gemma 3.
    #[error("field '{field}' is \"{found}\", expected one of {expected}")]
    NotGemma3 {
        /// The field naming the architecture.
        field: &'static str,
        /// Its value.
        found: String,
        /// The accepted values.
        expected: &'static str,
    },
}

impl Gemma3Config {
    /// Whether `layer` (0-based) attends through a sliding window; every
    /// `sliding_window_pattern`-th layer (layers 5, 11, ... for pattern 6) is global.
    pub fn is_sliding(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(self.sliding_window_pattern)
    }

    /// Parameters of the model: the embedding (tied to the output), the
    /// final norm and every layer's projections and norms, counted from the
    /// shapes whatever the weights' storage (packed or block-quantized
    /// arrays hold fewer elements).
    pub fn parameters(&self) -> usize {
        let (hidden, head) = (self.hidden_size, self.head_dim);
        let (q, kv) = (
            self.num_attention_heads * head,
            self.num_key_value_heads * head,
        );
        let layer =
            hidden * (2 * q + 2 * kv) + 3 * hidden * self.intermediate_size + 4 * hidden + 2 * head;
        self.vocab_size * hidden + hidden + self.num_hidden_layers * layer
    }

    /// The factor attention scores are multiplied by: `query_pre_attn_scalar^-1/2`,
    /// computed in f64 and rounded once, as mlx-lm does in Python.
    pub fn attention_scale(&self) -> f32 {
        f64::from(self.query_pre_attn_scalar).powf(-0.5) as f32
    }

    /// Checks the values the forward pass relies on (sizes nonzero, heads
    /// divisible into key/value groups, positive finite floats).
    fn validate(&self) -> Result<(), ConfigProblem> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("sliding_window", self.sliding_window),
            ("sliding_window_pattern", self.sliding_window_pattern),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(bad_value(field, value, "must be at least 1"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(bad_value(
                "num_key_value_heads",
                self.num_key_value_heads,
                &format!(
                    "must divide num_attention_heads ({})",
                    self.num_attention_heads
                ),
            ));
        }
        let floats = [
            ("rms_norm_eps", Some(self.rms_norm_eps)),
            ("rope_theta", Some(self.rope_theta)),
            ("rope_local_base_freq", Some(self.rope_local_base_freq)),
            ("query_pre_attn_scalar", Some(self.query_pre_attn_scalar)),
            ("rope_scaling.factor", self.rope_scaling),
            ("final_logit_softcapping", self.final_logit_softcapping),
            ("attn_logit_softcapping", self.attn_logit_softcapping),
        ];
        for (field, value) in floats {
            if let Some(v) = value {
                if !(v.is_finite() && v > 0.0) {
                    return Err(bad_value(field, v, "must be a positive finite number"));
                }
            }
        }
        Ok(())
    }
}

/// A [`ConfigProblem::BadValue`].
fn bad_value(field: &str, value: impl std::fmt::Display, reason: &str) -> ConfigProblem {
    ConfigProblem::BadValue {
        field: field.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}
