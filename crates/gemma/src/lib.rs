//! Gemma 3 text models on MLX: configuration, weights, tokenizer, forward pass and KV caches.

pub mod affine_linear;
pub mod cache;
pub mod chat_template;
pub mod config;
pub mod convert;
mod cpu_attention;
mod cpu_gelu;
mod cpu_layer;
mod cpu_projection;
mod cpu_prompt_attention;
pub mod decode_step;
pub mod gguf_linear;
pub mod kernels;
mod kv_target;
pub mod linear;
pub mod load;
pub mod model;
pub mod tokenizer;
pub mod weights;
