//! The error type of the sampler.

use mlx_core::Dtype;

/// What went wrong when configuring or running a sampler.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// A [`crate::SamplerConfig`] field holds a value outside its accepted range.
    #[error("sampler setting `{field}` = {value} is out of range: {expected}")]
    InvalidSetting {
        /// The field's name, as in `SamplerConfig`.
        field: &'static str,
        /// The rejected value, as text.
        value: String,
        /// The accepted range, in words.
        expected: &'static str,
    },
    /// The logits are not a float array of shape `[1, vocab]`.
    #[error(
        "sampler: logits must be a float array of shape [1, vocab], got {dtype} of shape {shape:?}"
    )]
    BadLogits {
        /// The shape given.
        shape: Vec<i32>,
        /// The dtype given.
        dtype: Dtype,
    },
    /// The token history is not an int32 or uint32 array of shape `[n]`.
    #[error("sampler: the token history must be an int32 or uint32 array of shape [n], got {dtype} of shape {shape:?}")]
    BadHistory {
        /// The shape given.
        shape: Vec<i32>,
        /// The dtype given.
        dtype: Dtype,
    },
    /// `logit_bias` names a token id outside the logits' vocabulary.
    #[error("sampler setting `logit_bias` names token {token}, outside the vocabulary of {vocab} tokens")]
    BiasTokenOutOfVocab {
        /// The offending token id.
        token: u32,
        /// The vocabulary size (the logits' last dimension).
        vocab: i32,
    },
    /// `xtc_special_tokens` names a token id outside the logits' vocabulary.
    #[error("sampler setting `xtc_special_tokens` names token {token}, outside the vocabulary of {vocab} tokens")]
    XtcTokenOutOfVocab {
        /// The offending token id.
        token: u32,
        /// The vocabulary size (the logits' last dimension).
        vocab: i32,
    },
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
}
