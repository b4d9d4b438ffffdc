//! Projection matrices, dense or MLX-quantized, and the embedding table.

use mlx_core::{Array, QuantizedArray};

use crate::kernels::linear_row;

/// A weight matrix `[out, in]` applied as `x @ Wᵀ`.
#[derive(Debug, Clone)]
pub enum Linear {
    /// Full-precision weights.
    Dense(Array),
    /// MLX affine-quantized weights, multiplied without dequantizing.
    Quantized(QuantizedArray),
}

impl Linear {
    /// `x @ Wᵀ`.
    pub fn forward(&self, x: &Array) -> mlx_core::Result<Array> {
        self.forward_with(x, false)
    }

    /// `x @ Wᵀ`; with `gpu_kernels`, a single row against dense weights runs
    /// through our GEMV kernel ([`crate::kernels::linear_row`]).
    pub fn forward_with(&self, x: &Array, gpu_kernels: bool) -> mlx_core::Result<Array> {
        match self {
            Linear::Dense(w) => linear_row(x, w, gpu_kernels),
            Linear::Quantized(q) => q.matmul(x, true),
        }
    }

    /// `x @ Wᵀ` of a matrix that stacks several projections along its
    /// output rows, split back into one output per projection of `sizes`
    /// rows. A single input row runs as one fused product (one pass over the
    /// weights while decoding); several rows run one product per projection,
    /// so prefill rounds exactly as separate projections do (as mlx-lm's).
    /// `gpu_kernels` as in [`Linear::forward_with`].
    pub fn forward_parts(
        &self,
        x: &Array,
        sizes: &[i32],
        gpu_kernels: bool,
    ) -> mlx_core::Result<Vec<Array>> {
        let rows = x.size() / x.dim(-1)?.max(1) as usize;
        let mut start = 0;
        let mut out = Vec::with_capacity(sizes.len());
        if rows == 1 {
            let fused = self.forward_with(x, gpu_kernels)?;
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
            out.push(self.output_rows(start, start + size)?.forward(x)?);
            start += size;
        }
        Ok(out)
    }

    /// The projection made of output rows `start..end`.
    fn output_rows(&self, start: i32, end: i32) -> mlx_core::Result<Linear> {
        let rows = |a: &Array| {
            let cols = a.dim(1)?;
            a.slice(&[start, 0], &[end, cols], &[1, 1])
        };
        Ok(match self {
            Linear::Dense(w) => Linear::Dense(rows(w)?),
            Linear::Quantized(q) => Linear::Quantized(QuantizedArray {
                packed: rows(&q.packed)?,
                scales: rows(&q.scales)?,
                biases: rows(&q.biases)?,
                group_size: q.group_size,
                bits: q.bits,
            }),
        })
    }

    /// Rows `indices` of the matrix (an embedding lookup), in full precision.
    pub fn rows(&self, indices: &Array) -> mlx_core::Result<Array> {
        match self {
            Linear::Dense(w) => w.take(indices, 0),
            Linear::Quantized(q) => QuantizedArray {
                packed: q.packed.take(indices, 0)?,
                scales: q.scales.take(indices, 0)?,
                biases: q.biases.take(indices, 0)?,
                group_size: q.group_size,
                bits: q.bits,
            }
            .dequantize(),
        }
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        match self {
            Linear::Dense(w) => w.nbytes(),
            Linear::Quantized(q) => q.nbytes(),
        }
    }

    /// The arrays held.
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Linear::Dense(w) => vec![w],
            Linear::Quantized(q) => vec![&q.packed, &q.scales, &q.biases],
        }
    }
}
