//! Projection matrices — dense, MLX-quantized or GGUF blocks as stored —
//! and the embedding table, with their products: `gguf.rs` and `affine.rs`
//! multiply the quantized ones on the CPU (`rows.rs` makes a product one
//! MLX operation, `tasks.rs` runs one row's product on rayon's pool), and
//! `projection.rs` reads a projection's pieces for the CPU decode block.
//! Each file imports only those listed before it here.

pub mod affine;
pub mod gguf;
pub(crate) mod projection;
mod rows;
mod tasks;

use mlx_core::block_dot::CpuKernels;
use mlx_core::{concatenate, Array, Dtype, QuantizedArray};

use crate::quant::GgufDtype;
pub use gguf::GgufMatrix;

/// A product of rows of activations with dense weights `[out, in]`,
/// `x @ Wᵀ`: MLX's matmul ([`mlx_matmul`]) unless the caller has a kernel of
/// a device's for it.
pub type DenseProduct = fn(&Array, &Array) -> mlx_core::Result<Array>;

/// `x @ Wᵀ` by MLX's matmul.
pub fn mlx_matmul(x: &Array, w: &Array) -> mlx_core::Result<Array> {
    x.linear(w)
}

/// How the device a forward pass computes on multiplies what a [`Linear`]
/// holds, where it has kernels of its own.
#[derive(Debug, Clone, Copy)]
pub struct Products {
    /// Products with dense weights.
    pub dense: DenseProduct,
    /// Products with GGUF blocks as stored where the device has kernels for
    /// them (the GPU's); `None`: our CPU kernels ([`GgufMatrix::times`]).
    pub blocks: Option<BlockProducts>,
}

impl Products {
    /// MLX's matmul, and GGUF blocks on our CPU kernels.
    pub const CPU: Products = Products {
        dense: mlx_matmul,
        blocks: None,
    };
}

/// Values of a GGUF matrix dequantized at once for a product of several
/// rows: 128 Mi (256 MiB of bfloat16), so that every projection of every
/// Gemma size is one product (27B's gate and up, 115.6 M values, cut in
/// two ran its 2,048-token prompt 20 % slower on an H100); larger matrices
/// (an embedding) are multiplied in slices of rows, one evaluated after
/// another, so that no whole dequantized copy is ever held.
const MAX_DEQUANTIZED_VALUES: i64 = 1 << 27;

/// The rows of a slice are a multiple of this: a product's output width of
/// odd size (27B's gate cut at 2^26 values gave 12,483 and 9,021 rows) takes
/// cuBLAS off its aligned kernels (the prompt ran at half the speed).
const SLICE_ROWS_MULTIPLE: u64 = 256;

/// Rows of each slice of a `rows × cols` matrix dequantized for a product:
/// all of them where they fit [`MAX_DEQUANTIZED_VALUES`], else as few equal
/// slices as fit it, each rounded up to [`SLICE_ROWS_MULTIPLE`] rows (the
/// last one shorter) unless fewer rows than that fit.
fn slice_rows(rows: i32, cols: i32) -> i32 {
    let most = (MAX_DEQUANTIZED_VALUES / i64::from(cols.max(1))).max(1) as u64;
    let all = rows.max(0) as u64;
    if all <= most {
        return rows;
    }
    let even = all.div_ceil(all.div_ceil(most));
    if most < SLICE_ROWS_MULTIPLE {
        return even as i32;
    }
    let aligned = even.next_multiple_of(SLICE_ROWS_MULTIPLE);
    aligned.min(all) as i32
}

/// `x @ Wᵀ` for several rows of activations against GGUF blocks: each
/// slice of rows ([`slice_rows`]) dequantized by `b` into `x`'s dtype, then
/// MLX's matmul.
fn dequantized_product(x: &Array, g: &GgufMatrix, b: BlockProducts) -> mlx_core::Result<Array> {
    let rows = g.rows()?;
    let slice = slice_rows(rows, g.cols);
    if rows <= slice {
        return x.linear(&(b.dequantize)(g, x.dtype())?);
    }
    // Each slice's product evaluated before the next is dequantized.
    let mut outs = Vec::new();
    for start in (0..rows).step_by(slice as usize) {
        let part = g.row_range(start, (start + slice).min(rows))?;
        let out = x.linear(&(b.dequantize)(&part, x.dtype())?)?;
        out.eval()?;
        outs.push(out);
    }
    concatenate(&outs.iter().collect::<Vec<_>>(), -1)
}

/// A device's products with GGUF blocks as stored.
#[derive(Debug, Clone, Copy)]
pub struct BlockProducts {
    /// One row of activations `[..., K]` times the matrix, in the
    /// activations' dtype.
    pub row: fn(&Array, &GgufMatrix) -> mlx_core::Result<Array>,
    /// The matrix as floats of a dtype, `[rows, K]`.
    pub dequantize: fn(&GgufMatrix, Dtype) -> mlx_core::Result<Array>,
}

/// A weight matrix `[out, in]` applied as `x @ Wᵀ`.
#[derive(Debug, Clone)]
pub enum Linear {
    /// Full-precision weights.
    Dense(Array),
    /// MLX affine-quantized weights, multiplied without dequantizing.
    Quantized(QuantizedArray),
    /// MLX affine-quantized weights whose products run on the CPU through
    /// [`affine`]: one row by our kernel of the family given
    /// with 8-bit activations, several by a matmul over the dequantized
    /// matrix.
    QuantizedCpu(QuantizedArray, CpuKernels),
    /// GGUF blocks as stored (the CPU), multiplied by our kernel.
    Gguf(GgufMatrix),
    /// Projections stacked along the output rows that cannot share one
    /// matrix (GGUF blocks of different types), applied one after another.
    Parts(Vec<Linear>),
}

impl Linear {
    /// `x @ Wᵀ` on the CPU.
    pub fn forward(&self, x: &Array) -> mlx_core::Result<Array> {
        self.forward_with(x, Products::CPU)
    }

    /// `x @ Wᵀ` with `products`.
    pub fn forward_with(&self, x: &Array, products: Products) -> mlx_core::Result<Array> {
        match self {
            Linear::Dense(w) => (products.dense)(x, w),
            Linear::Quantized(q) => q.matmul(x, true),
            Linear::QuantizedCpu(q, kernels) => affine::times(q, *kernels, x),
            Linear::Gguf(g) => match products.blocks {
                None => g.times(x),
                Some(b) if x.size() == g.cols.max(0) as usize => (b.row)(x, g),
                Some(b) => dequantized_product(x, g, b),
            },
            Linear::Parts(parts) => {
                let outs = parts
                    .iter()
                    .map(|p| p.forward_with(x, products))
                    .collect::<mlx_core::Result<Vec<_>>>()?;
                concatenate(&outs.iter().collect::<Vec<_>>(), -1)
            }
        }
    }

    /// `x @ Wᵀ` of a matrix that stacks several projections along its
    /// output rows, split back into one output per projection of `sizes`
    /// rows. A single input row runs as one fused product (one pass over the
    /// weights while decoding); several rows run one product per projection,
    /// so prefill rounds exactly as separate projections do (as mlx-lm's).
    pub fn forward_parts(
        &self,
        x: &Array,
        sizes: &[i32],
        products: Products,
    ) -> mlx_core::Result<Vec<Array>> {
        let rows = x.size() / x.dim(-1)?.max(1) as usize;
        let mut start = 0;
        let mut out = Vec::with_capacity(sizes.len());
        if rows == 1 {
            let fused = self.forward_with(x, products)?;
            let mut begin = vec![0; fused.ndim()];
            let mut end = fused.shape();
            let strides = vec![1; fused.ndim()];
            let last = fused.ndim() - 1;
            for &size in sizes {
                begin[last] = start;
                end[last] = start + size;
                out.push(fused.slice(&begin, &end, &strides)?);
                start += size;
            }
            return Ok(out);
        }
        for &size in sizes {
            out.push(
                self.output_rows(start, start + size)?
                    .forward_with(x, products)?,
            );
            start += size;
        }
        Ok(out)
    }

    /// Output rows of the projection.
    pub fn out_rows(&self) -> mlx_core::Result<i32> {
        match self {
            Linear::Dense(w) => w.dim(0),
            Linear::Quantized(q) | Linear::QuantizedCpu(q, _) => q.packed.dim(0),
            Linear::Gguf(g) => g.rows(),
            Linear::Parts(parts) => parts.iter().map(Linear::out_rows).sum(),
        }
    }

    /// The projection made of output rows `start..end`.
    fn output_rows(&self, start: i32, end: i32) -> mlx_core::Result<Linear> {
        let rows = |a: &Array| {
            let cols = a.dim(1)?;
            a.slice(&[start, 0], &[end, cols], &[1, 1])
        };
        let quantized_rows = |q: &QuantizedArray| -> mlx_core::Result<QuantizedArray> {
            Ok(QuantizedArray {
                packed: rows(&q.packed)?,
                scales: rows(&q.scales)?,
                biases: rows(&q.biases)?,
                group_size: q.group_size,
                bits: q.bits,
            })
        };
        Ok(match self {
            Linear::Dense(w) => Linear::Dense(rows(w)?),
            Linear::Quantized(q) => Linear::Quantized(quantized_rows(q)?),
            Linear::QuantizedCpu(q, kernels) => Linear::QuantizedCpu(quantized_rows(q)?, *kernels),
            Linear::Gguf(g) => Linear::Gguf(g.row_range(start, end)?),
            Linear::Parts(parts) => {
                // The range lies within one part (the callers ask for whole
                // projections).
                let mut first = 0;
                for part in parts {
                    let n = part.out_rows()?;
                    if start >= first && end <= first + n {
                        return part.output_rows(start - first, end - first);
                    }
                    first += n;
                }
                return Err(mlx_core::Error::Host(format!(
                    "rows {start}..{end} span several stacked projections"
                )));
            }
        })
    }

    /// Rows `indices` of the matrix (an embedding lookup), in full
    /// precision, on the CPU.
    pub fn rows(&self, indices: &Array) -> mlx_core::Result<Array> {
        self.rows_with(indices, Products::CPU, Dtype::Float32)
    }

    /// [`Linear::rows`] with `products` (GGUF rows dequantized by its
    /// blocks' kernels, in `dtype`).
    pub fn rows_with(
        &self,
        indices: &Array,
        products: Products,
        dtype: Dtype,
    ) -> mlx_core::Result<Array> {
        if let (Linear::Gguf(g), Some(b)) = (self, products.blocks) {
            let taken = g.taken(indices)?;
            let mut shape = indices.shape();
            shape.push(g.cols);
            return (b.dequantize)(&taken, dtype)?.reshape(&shape);
        }
        match self {
            Linear::Dense(w) => w.take(indices, 0),
            Linear::Quantized(q) | Linear::QuantizedCpu(q, _) => QuantizedArray {
                packed: q.packed.take(indices, 0)?,
                scales: q.scales.take(indices, 0)?,
                biases: q.biases.take(indices, 0)?,
                group_size: q.group_size,
                bits: q.bits,
            }
            .dequantize(),
            Linear::Gguf(g) => g.take_rows(indices),
            Linear::Parts(_) => Err(mlx_core::Error::Host(
                "stacked projections are not an embedding table".into(),
            )),
        }
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        match self {
            Linear::Dense(w) => w.nbytes(),
            Linear::Quantized(q) | Linear::QuantizedCpu(q, _) => q.nbytes(),
            Linear::Gguf(g) => g.bytes.nbytes(),
            Linear::Parts(parts) => parts.iter().map(Linear::nbytes).sum(),
        }
    }

    /// The arrays held.
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Linear::Dense(w) => vec![w],
            Linear::Quantized(q) | Linear::QuantizedCpu(q, _) => {
                vec![&q.packed, &q.scales, &q.biases]
            }
            Linear::Gguf(g) => vec![&g.bytes],
            Linear::Parts(parts) => parts.iter().flat_map(Linear::arrays).collect(),
        }
    }

    /// The GGUF block types held as stored (none for other weights).
    pub fn gguf_types(&self) -> Vec<GgufDtype> {
        match self {
            Linear::Gguf(g) => vec![g.dtype],
            Linear::Parts(parts) => parts.iter().flat_map(Linear::gguf_types).collect(),
            Linear::Dense(_) | Linear::Quantized(_) | Linear::QuantizedCpu(..) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrices_that_fit_are_not_sliced() {
        assert_eq!(slice_rows(10_240, 3_840), 10_240);
        assert_eq!(slice_rows(1 << 16, 1 << 10), 1 << 16);
        // 27B's gate and up: 21,504 × 5,376 = 115.6 M values, one product.
        assert_eq!(slice_rows(21_504, 5_376), 21_504);
    }

    #[test]
    fn large_matrices_are_cut_into_equal_slices_of_aligned_rows() {
        // 27B's embedding: 262,144 rows, at most 24,966 a slice: 11 slices
        // of 23,832 rounded up to 24,064 (the last 21,504).
        assert_eq!(slice_rows(262_144, 5_376), 24_064);
        // Rows too wide for 256 of them to fit: not aligned.
        assert_eq!(slice_rows(1_000, 1 << 28), 1);
        assert_eq!(slice_rows(1_000, 1 << 20), 125);
    }
}
