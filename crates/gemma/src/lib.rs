//! Gemma 3 text models on MLX: configuration, weights, tokenizer, forward pass and KV caches.
//!
//! The modules, from the ground up (each uses only those before it): the
//! block formats of ggml ([`quant`]) and the GGUF container ([`gguf`]); the
//! configuration ([`config`]), tokenizer and chat template; the KV caches
//! ([`cache`]); projection matrices and their products ([`linear`]); the
//! model as plain data ([`model`]); each device's kernels (`cpu`, [`cuda`]);
//! the forward pass and the compiled decode step ([`forward`]); loading
//! weights from files ([`weights`], [`load`]) and writing them
//! ([`convert`]).

pub mod cache;
pub mod chat_template;
pub mod config;
pub mod convert;
mod cpu;
pub mod cuda;
pub mod forward;
pub mod gguf;
pub mod linear;
pub mod load;
pub mod model;
pub mod quant;
pub mod tokenizer;
pub mod weights;
