//! Weight loading, one module per file format (the GGUF container itself is
//! [`crate::gguf`]), and the assembly of tensors into a model
//! ([`tensors`]).

mod gguf_loader;
pub mod gguf_names;
mod random;
mod safetensors;
pub mod tensors;

pub use gguf_loader::load_gguf_tensors;
pub use random::random_tensors;
pub use safetensors::{load_safetensors_tensors, shard_files};
pub use tensors::{Tensor, TensorMap, WeightsError};
