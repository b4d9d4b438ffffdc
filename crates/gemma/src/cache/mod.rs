//! KV caches: one per layer, chosen in `Gemma3::make_caches`, each in the
//! format [`LayerFormats`] gives its layer.
//!
//! - [`KvCache`] (global layers): grows in steps of [`STEP`] positions.
//! - [`RotatingKvCache`] (sliding layers): a ring buffer of the window size.
//!
//! Both store keys and values in any [`KvFormat`] — floats, MLX affine
//! quantization, ggml's block formats ([`block`]) or TurboQuant ([`turbo`]),
//! with independent formats for keys and values — so a
//! "quantized cache" is either kind with a quantized format: quantization is a
//! storage format ([`KvStore`]), not a third kind of cache. Vectors are encoded
//! as they enter, so the queries of a prefill chunk attend to the stored
//! (possibly quantized) keys and values, their own included.

pub mod block;
mod buffers;
mod error;
mod format;
mod layer;
mod layer_formats;
mod plain;
mod rotating;
mod rotation;
pub mod turbo;

pub use block::BlockArray;
pub use buffers::{Attend, CacheFormat, FixedSlot, KeyMask, LayerKv, QueryRounding, STEP};
pub use error::CacheError;
pub use format::{KvFormat, KvStore, VectorSpec};
pub use layer::LayerCache;
pub use layer_formats::LayerFormats;
pub use plain::KvCache;
pub use rotating::RotatingKvCache;
pub use rotation::Rotation;
pub use turbo::TurboArray;
