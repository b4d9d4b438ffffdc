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

/// Values decoded by one rayon task (whole blocks, at least one), so that
/// tiny blocks do not drown in scheduling and two cores still share a
/// matrix of a few blocks evenly.
const VALUES_PER_TASK: usize = 16_384;

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
        Q4_0 => run_format(bytes, out, blocks::Q4_0),
        Q4_1 => run_format(bytes, out, blocks::Q4_1),
        Q5_0 => run_format(bytes, out, blocks::Q5_0),
        Q5_1 => run_format(bytes, out, blocks::Q5_1),
        Q8_0 => run_format(bytes, out, blocks::Q8_0),
        IQ4_NL => run_format(bytes, out, blocks::IQ4_NL),
        Q2_K => run_format(bytes, out, blocks::Q2_K),
        Q3_K => run_format(bytes, out, blocks::Q3_K),
        Q4_K => run_format(bytes, out, blocks::Q4_K),
        Q5_K => run_format(bytes, out, blocks::Q5_K),
        Q6_K => run_format(bytes, out, blocks::Q6_K),
        other => return Err(DequantError::Unsupported(other)),
    }
    Ok(())
}

/// Applies a decoder of single values to every one, in parallel. `bytes`
/// holds `N` bytes per value.
fn run<const N: usize>(
    bytes: &[u8],
    out: &mut [f32],
    decode: impl Fn(&[u8; N], &mut [f32]) + Sync,
) {
    run_blocks(bytes, out, N, |values, out| {
        for (value, o) in values.chunks_exact(N).zip(out.chunks_exact_mut(1)) {
            // The conversion succeeds: the chunks have exactly N bytes.
            if let Ok(value) = value.try_into() {
                decode(value, o);
            }
        }
    })
}

/// Applies a decoder of runs of blocks to every block, in parallel,
/// [`VALUES_PER_TASK`] values to a task. `bytes` holds whole
/// blocks of `block_bytes` bytes and `out` room for the values of each.
fn run_blocks(
    bytes: &[u8],
    out: &mut [f32],
    block_bytes: usize,
    decode: impl Fn(&[u8], &mut [f32]) + Sync,
) {
    let block_bytes = block_bytes.max(1);
    let values = (out.len() / (bytes.len() / block_bytes).max(1)).max(1);
    let blocks = (VALUES_PER_TASK / values).max(1);
    bytes
        .par_chunks(block_bytes * blocks)
        .zip(out.par_chunks_mut(values * blocks))
        .for_each(|(blocks, values)| decode(blocks, values));
}

/// [`run_blocks`] with a block format's decoder (see
/// [`super::blocks::IntBlock::value`]).
fn run_format<const N: usize, const G: usize, F: Format<N, G>>(
    bytes: &[u8],
    out: &mut [f32],
    _format: F,
) {
    run_blocks(bytes, out, N, decode_blocks::<N, G, F>)
}

/// Consecutive blocks' values, compiled for the widest vectors the machine
/// has (chosen once per run of blocks, not per block).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl", "x86_64+avx2+fma"))]
fn decode_blocks<const N: usize, const G: usize, F: Format<N, G>>(blocks: &[u8], out: &mut [f32]) {
    for (block, out) in blocks.chunks_exact(N).zip(out.chunks_exact_mut(G * GROUP)) {
        let Ok(block) = block.try_into() else {
            continue;
        };
        let ints = F::decode(block);
        for (g, group) in out.chunks_exact_mut(GROUP).take(G).enumerate() {
            for (i, v) in group.iter_mut().enumerate() {
                *v = ints.value(g, i);
            }
        }
    }
}
