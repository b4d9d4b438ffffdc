//! Generation, chat and KV-cache evaluation of Gemma 3 models on MLX, and the
//! `gemma-mlx` command.

pub mod chat;
pub mod engine;
pub mod error;
pub mod generate;
pub mod kld;
pub mod kv_layers;
pub mod kv_spec;
pub mod metrics;
pub mod options;

pub use chat::ChatSession;
pub use engine::{Engine, ModelMetadata, ProductPath};
pub use error::GenerateError;
pub use generate::{generate, Generation, TokenEvent};
pub use kv_spec::{KvSpec, KvSpecError};
pub use metrics::Metrics;
pub use options::{FinishReason, GenerateOptions};
