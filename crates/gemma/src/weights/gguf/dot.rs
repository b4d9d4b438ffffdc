//! Products of GGUF block-quantized rows with float vectors, reading the
//! blocks as stored: each block is decoded into registers by the same
//! decoders [`super::dequantize`] uses (so the weights are exactly ggml's)
//! and multiplied there, never written out; Q8_0 and Q5_0 (most of the
//! default model's bytes) take their block scale out of the sum instead.
//! Rows run in parallel; an AVX2 build of the inner loop is picked at run
//! time where the CPU has it.

use multiversion::multiversion;
use rayon::prelude::*;

use super::dequant::{q2_k, q3_k, q4_0, q4_1, q4_k, q5_1, q5_k, q6_k, DequantError};
use super::dtype::GgufDtype;

/// Rows handed to one rayon task at least.
const MIN_ROWS_PER_TASK: usize = 16;

/// Whether rows of `dtype` can be multiplied as stored.
pub fn can_multiply(dtype: GgufDtype) -> bool {
    use GgufDtype::*;
    matches!(
        dtype,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K
    )
}

/// `out[m · rows + r] = Σ_j w[r, j] · x[m · cols + j]`: every row `r` of the
/// matrix `w` (`rows` rows of `cols` values of `dtype`, whole blocks each)
/// against every row `m` of `x`.
pub fn rows_times(
    dtype: GgufDtype,
    w: &[u8],
    cols: usize,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), DequantError> {
    use GgufDtype::*;
    let block = dtype.block_size() as usize;
    let type_size = dtype.type_size() as usize;
    let row_bytes = cols / block.max(1) * type_size;
    let fits = can_multiply(dtype)
        && cols > 0
        && cols.is_multiple_of(block)
        && w.len().is_multiple_of(row_bytes.max(1))
        && x.len().is_multiple_of(cols)
        && out.len() == (w.len() / row_bytes.max(1)) * (x.len() / cols);
    if !fits {
        return Err(DequantError::PartialBlock {
            dtype,
            len: w.len(),
            type_size: type_size as u64,
        });
    }
    match dtype {
        Q4_0 => run(w, row_bytes, x, cols, out, decoded(q4_0)),
        Q4_1 => run(w, row_bytes, x, cols, out, decoded(q4_1)),
        Q5_0 => run(w, row_bytes, x, cols, out, q5_0_dot),
        Q5_1 => run(w, row_bytes, x, cols, out, decoded(q5_1)),
        Q8_0 => run(w, row_bytes, x, cols, out, q8_0_dot),
        Q2_K => run(w, row_bytes, x, cols, out, decoded(q2_k)),
        Q3_K => run(w, row_bytes, x, cols, out, decoded(q3_k)),
        Q4_K => run(w, row_bytes, x, cols, out, decoded(q4_k)),
        Q5_K => run(w, row_bytes, x, cols, out, decoded(q5_k)),
        Q6_K => run(w, row_bytes, x, cols, out, decoded(q6_k)),
        other => return Err(DequantError::Unsupported(other)),
    }
    Ok(())
}

/// A block's dot product through its decoder: the `B` values decoded (as
/// [`super::dequantize`] gives them), then multiplied in eight running sums.
#[inline(always)]
fn decoded<const N: usize, const B: usize>(
    decode: fn(&[u8; N], &mut [f32; B]),
) -> impl Fn(&[u8; N], &[f32]) -> f32 + Copy + Send + Sync {
    move |block, xs| {
        let mut values = [0f32; B];
        decode(block, &mut values);
        let mut sums = [0f32; 8];
        for (v, x) in values.chunks_exact(8).zip(xs.chunks_exact(8)) {
            for l in 0..8 {
                sums[l] += v[l] * x[l];
            }
        }
        sums.iter().sum()
    }
}

/// The little-endian f16 at the start of a block, widened.
#[inline(always)]
fn f16_scale(block: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32()
}

/// Q8_0 (f16 `d`, 32 signed bytes): `d · Σ q·x`, the scale taken out of the
/// sum.
#[inline(always)]
fn q8_0_dot(block: &[u8; 34], xs: &[f32]) -> f32 {
    let (Ok(q), Ok(x)) = (
        <&[u8; 32]>::try_from(&block[2..]),
        <&[f32; 32]>::try_from(xs),
    ) else {
        return 0.0;
    };
    let mut sums = [0f32; 8];
    for i in 0..32 {
        sums[i % 8] += f32::from(q[i] as i8) * x[i];
    }
    f16_scale(block) * sums.iter().sum::<f32>()
}

/// Q5_0 (f16 `d`, 32 high bits, 16 bytes of low nibbles; value
/// `d · (q − 16)`): `d · Σ (q − 16)·x`.
#[inline(always)]
fn q5_0_dot(block: &[u8; 22], xs: &[f32]) -> f32 {
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    let mut sums = [0f32; 8];
    for (j, &q) in block[6..].iter().enumerate() {
        let lo = (u32::from(q & 0x0F) | ((qh >> j) & 1) << 4) as i32 - 16;
        let hi = (u32::from(q >> 4) | ((qh >> (j + 16)) & 1) << 4) as i32 - 16;
        sums[j % 8] += lo as f32 * xs[j] + hi as f32 * xs[j + 16];
    }
    f16_scale(block) * sums.iter().sum::<f32>()
}

/// [`rows_times`] for one decoder: the matrix's rows in parallel, each
/// against every row of `x`.
fn run<const N: usize, D>(
    w: &[u8],
    row_bytes: usize,
    x: &[f32],
    cols: usize,
    out: &mut [f32],
    block_dot: D,
) where
    D: Fn(&[u8; N], &[f32]) -> f32 + Copy + Send + Sync,
{
    let values = cols / (row_bytes / N);
    let rows = w.len() / row_bytes;
    let inputs = x.len() / cols;
    let mut products = vec![0f32; rows * inputs];
    products
        .par_chunks_mut(inputs)
        .zip(w.par_chunks(row_bytes))
        .with_min_len(MIN_ROWS_PER_TASK)
        .for_each(|(dots, row)| {
            for (dot, xs) in dots.iter_mut().zip(x.chunks_exact(cols)) {
                *dot = row_dot(row, xs, values, block_dot);
            }
        });
    // `products` is row-major by matrix row; the output by input row.
    for (r, dots) in products.chunks_exact(inputs).enumerate() {
        for (m, &d) in dots.iter().enumerate() {
            out[m * rows + r] = d;
        }
    }
}

/// One row of blocks dotted with `x` (`values` per block), block by block.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
fn row_dot<const N: usize, D>(row: &[u8], x: &[f32], values: usize, block_dot: D) -> f32
where
    D: Fn(&[u8; N], &[f32]) -> f32 + Copy,
{
    let mut total = 0f32;
    for (block, xs) in row.chunks_exact(N).zip(x.chunks_exact(values)) {
        if let Ok(block) = block.try_into() {
            total += block_dot(block, xs);
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::gguf::dequantize;

    /// Random blocks of `dtype` whose f16 fields are finite: bytes from a
    /// small generator, every f16 field overwritten with 0.0123 or -0.0456.
    fn blocks(dtype: GgufDtype, n_blocks: usize, seed: u64) -> Vec<u8> {
        let mut state = seed;
        let size = dtype.type_size() as usize;
        let mut bytes: Vec<u8> = (0..n_blocks * size)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) as u8
            })
            .collect();
        use GgufDtype::*;
        // Byte offsets of the f16 fields within a block.
        let halves: &[usize] = match dtype {
            Q4_0 | Q5_0 | Q8_0 => &[0],
            Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
            Q2_K => &[80, 82],
            Q3_K => &[108],
            Q6_K => &[208],
            _ => &[],
        };
        for (i, block) in bytes.chunks_exact_mut(size).enumerate() {
            for &at in halves {
                let v = if (i + at) % 2 == 0 {
                    0.0123f32
                } else {
                    -0.0456
                };
                block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
        bytes
    }

    #[test]
    fn every_block_type_multiplies_as_its_dequantized_rows_do() {
        use GgufDtype::*;
        for dtype in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K] {
            let (rows, cols, inputs) = (37, 512, 3);
            let blocks_per_row = cols / dtype.block_size() as usize;
            let w = blocks(dtype, rows * blocks_per_row, dtype.id() as u64 + 7);
            let x: Vec<f32> = (0..inputs * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut ours = vec![0f32; rows * inputs];
            rows_times(dtype, &w, cols, &x, &mut ours).unwrap();
            let dense = dequantize(dtype, &w).unwrap();
            for m in 0..inputs {
                for r in 0..rows {
                    let row = &dense[r * cols..(r + 1) * cols];
                    let xs = &x[m * cols..(m + 1) * cols];
                    let exact: f64 = row
                        .iter()
                        .zip(xs)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    let scale: f64 = row
                        .iter()
                        .zip(xs)
                        .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                        .sum();
                    let got = f64::from(ours[m * rows + r]);
                    assert!(
                        (got - exact).abs() <= 1e-6 * scale.max(1e-30),
                        "{dtype}: row {r}, input {m}: {got} against {exact}"
                    );
                }
            }
        }
    }

    #[test]
    fn shapes_that_do_not_split_into_blocks_are_refused() {
        let w = blocks(GgufDtype::Q8_0, 4, 1);
        let x = vec![0f32; 48];
        let mut out = vec![0f32; 4];
        // 48 values per row are not whole 32-value blocks.
        assert!(rows_times(GgufDtype::Q8_0, &w, 48, &x, &mut out).is_err());
        // An output of the wrong size.
        let x = vec![0f32; 64];
        let mut out = vec![0f32; 3];
        assert!(rows_times(GgufDtype::Q8_0, &w, 64, &x, &mut out).is_err());
        // A type that is not a block type.
        let mut out = vec![0f32; 2];
        assert!(rows_times(GgufDtype::F32, &w, 64, &x, &mut out).is_err());
    }
}
