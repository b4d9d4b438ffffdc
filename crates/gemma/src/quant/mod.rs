//! ggml's block-quantized formats, the formats of GGUF tensors: the type of
//! each tensor's elements ([`GgufDtype`]), each block decoded as small
//! integers with a scale (and offset) per 16 values (`blocks.rs`, one
//! description per format), dequantization bit for bit ggml's, ggml's
//! reference quantizers for the 32-value formats ([`quantize_into`]) and
//! their CUDA twins ([`KV_BLOCKS_CUDA`]), and products of rows as stored
//! with a row of activations ([`rows_times`]).

mod blocks;
mod dequant;
mod dot;
mod dtype;
mod kv_blocks_cuda;
mod quantize;

pub use dequant::{dequantize, dequantize_into, DequantError};
pub use dot::{can_multiply, rows_times, Activations, Arithmetic};
pub(crate) use dot::{Int8Row, MIN_BYTES_PER_TASK};
pub use dtype::GgufDtype;
pub use kv_blocks_cuda::{kv_block_type, KV_BLOCKS_CUDA};
pub use quantize::{quantize_into, QuantizeError, BLOCK_VALUES, QUANTIZABLE};
