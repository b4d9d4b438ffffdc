//! Errors of generation and evaluation.

/// What went wrong while generating or evaluating.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// The model failed.
    #[error(transparent)]
    Model(#[from] gemma::model::ModelError),
    /// The sampler settings are invalid.
    #[error(transparent)]
    Sample(#[from] sample::SampleError),
    /// Tokenizing or detokenizing failed.
    #[error(transparent)]
    Tokenizer(#[from] gemma::tokenizer::TokenizerError),
    /// The chat template failed.
    #[error(transparent)]
    ChatTemplate(#[from] gemma::chat_template::ChatTemplateError),
    /// The prompt does not fit the model's context.
    #[error("the prompt needs {tokens} tokens but the model's context is {context} tokens")]
    PromptTooLong {
        /// Tokens needed (cached and new).
        tokens: usize,
        /// The model's context length.
        context: usize,
    },
    /// The model produced NaN or infinite logits.
    #[error("non-finite logits (NaN or infinity) at generation step {step}")]
    NonFinite {
        /// The 0-based index of the token being generated.
        step: usize,
    },
    /// Bad input.
    #[error("{0}")]
    Input(String),
    /// A rank of a distributed run failed (every rank then fails with it).
    #[error("rank {rank} of {size} failed: {message}")]
    Rank {
        /// The failing rank.
        rank: usize,
        /// The number of ranks.
        size: usize,
        /// Its error.
        message: String,
    },
}
