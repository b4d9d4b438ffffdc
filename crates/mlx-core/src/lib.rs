//! Safe MLX arrays over this project's C API (`mlx-c/`).
//!
//! [`Array`] owns one MLX handle and frees it in `Drop`: memory is released
//! deterministically, never by a garbage collector. Every operation that can
//! fail returns [`Result`] with MLX's own message. All `unsafe` code of the
//! project lives here and in `mlx-sys`.

mod array;
pub mod block_dot;
pub mod compile;
pub mod cpu_kernel;
pub mod device;
pub mod distributed;
mod dtype;
mod error;
pub mod fast;
pub mod kernel;
pub mod memory;
mod ops;
pub mod quantize;
pub mod random;

pub use array::{async_eval, eval, Array};
pub use compile::Function;
pub use device::{Device, Stream};
pub use dtype::{Dtype, Element};
pub use error::{Error, Result};
pub use ops::{arange, concatenate, full, ones, stack, tri, where_, zeros};
pub use quantize::{quantize, QuantizedArray};
