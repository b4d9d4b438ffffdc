//! Dequantization of ggml blocks to f32, in parallel over blocks.
//!
//! The block decoders of [`super::blocks`] follow ggml's reference
//! `dequantize_row_*` (and the `gguf` Python package, which our tests compare
//! against bit for bit): the same f32 operations in the same order, with no
//! fused multiply-adds, so the results are identical, not merely close.

use half::f16;
use rayon::prelude::*;

use super::blocks::{self, Format, GROUP};
use super::dtype::GgufDtype;

/// Why raw bytes could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DequantError {
    /// The type has no decoder here.
    #[error("type {0} cannot be dequantized by this reader")]
    Unsupported(GgufDtype),
    /// The bytes do not split into whole blocks.
    #[error("{len} bytes are not a whole number of {dtype} blocks of {type_size} bytes")]
    PartialBlock {
        /// The type.
        dtype: GgufDtype,
        /// Bytes given.
        len: usize,
        /// Bytes per block of that type.
        type_size: u64,
    },
    /// The output does not hold exactly the blocks' values.
    #[error("{values} values of {dtype} blocks for an output of {out}")]
    OutputSize {
        /// The type.
        dtype: GgufDtype,
        /// Values in the blocks.
        values: usize,
        /// Values the output holds.
        out: usize,
    },
    /// A product kernel of `mlx-c` failed.
    #[error("block product kernel: {0}")]
    Kernel(String),
}

impl From<mlx_core::Error> for DequantError {
    fn from(e: mlx_core::Error) -> Self {
        DequantError::Kernel(e.to_string())
    }
}

/// Blocks handed to one rayon task at least, so that tiny blocks do not drown in scheduling.
const MIN_BLOCKS_PER_TASK: usize = 512;

/// Converts `bytes`, a whole number of `dtype` blocks, to f32 values in storage order.
pub fn dequantize(dtype: GgufDtype, bytes: &[u8]) -> Result<Vec<f32>, DequantError> {
    let n_blocks = bytes.len() / dtype.type_size().max(1) as usize;
    let mut out = vec![0f32; n_blocks * dtype.block_size() as usize];
    dequantize_into(dtype, bytes, &mut out)?;
    Ok(out)
}

/// [`dequantize`] into `out`, which must hold exactly the values of the
/// blocks.
pub fn dequantize_into(
    dtype: GgufDtype,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), DequantError> {
    use GgufDtype::*;
    let type_size = dtype.type_size();
    let n_blocks = bytes.len() / type_size.max(1) as usize;
    if !(bytes.len() as u64).is_multiple_of(type_size) {
        return Err(DequantError::PartialBlock {
            dtype,
            len: bytes.len(),
            type_size,
        });
    }
    let values = n_blocks * dtype.block_size() as usize;
    if out.len() != values {
        return Err(DequantError::OutputSize {
            dtype,
            values,
            out: out.len(),
        });
    }
    match dtype {
        F32 => run(bytes, out, |b: &[u8; 4], o: &mut [f32]| {
            o[0] = f32::from_le_bytes(*b)
        }),
        F16 => run(bytes, out, |b: &[u8; 2], o: &mut [f32]| {
            o[0] = f16::from_bits(u16::from_le_bytes(*b)).to_f32()
        }),
        BF16 => run(bytes, out, |b: &[u8; 2], o: &mut [f32]| {
            o[0] = f32::from_bits(u32::from(u16::from_le_bytes(*b)) << 16)
        }),
        Q4_0 => run(bytes, out, decoded(blocks::Q4_0)),
        Q4_1 => run(bytes, out, decoded(blocks::Q4_1)),
        Q5_0 => run(bytes, out, decoded(blocks::Q5_0)),
        Q5_1 => run(bytes, out, decoded(blocks::Q5_1)),
        Q8_0 => run(bytes, out, decoded(blocks::Q8_0)),
        IQ4_NL => run(bytes, out, decoded(blocks::IQ4_NL)),
        Q2_K => run(bytes, out, decoded(blocks::Q2_K)),
        Q3_K => run(bytes, out, decoded(blocks::Q3_K)),
        Q4_K => run(bytes, out, decoded(blocks::Q4_K)),
        Q5_K => run(bytes, out, decoded(blocks::Q5_K)),
        Q6_K => run(bytes, out, decoded(blocks::Q6_K)),
        other => return Err(DequantError::Unsupported(other)),
    }
    Ok(())
}

/// Applies a block decoder to every block, in parallel. `bytes` holds whole
/// blocks of `N` bytes and `out` room for the values of each.
fn run<const N: usize>(
    bytes: &[u8],
    out: &mut [f32],
    decode: impl Fn(&[u8; N], &mut [f32]) + Sync,
) {
    let values = out.len() / (bytes.len() / N).max(1);
    bytes
        .par_chunks_exact(N)
        .zip(out.par_chunks_exact_mut(values.max(1)))
        .with_min_len(MIN_BLOCKS_PER_TASK)
        .for_each(|(block, values)| {
            // The conversion succeeds: the chunks have exactly N bytes.
            if let Ok(block) = block.try_into() {
                decode(block, values);
            }
        });
}

/// A block format's values in f32 (see [`super::blocks::IntBlock::value`]).
#[inline(always)]
fn decoded<const N: usize, const G: usize, F: Format<N, G>>(
    _format: F,
) -> impl Fn(&[u8; N], &mut [f32]) + Sync {
    move |block, out| {
        let ints = F::decode(block);
        for (g, group) in out.chunks_exact_mut(GROUP).take(G).enumerate() {
            for (i, v) in group.iter_mut().enumerate() {
                *v = ints.value(g, i);
            }
        }
    }
}
