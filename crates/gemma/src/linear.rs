//! Projection matrices, dense or MLX-quantized, and the embedding table.

use mlx_core::{Array, QuantizedArray};

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
        match self {
            Linear::Dense(w) => x.linear(w),
            Linear::Quantized(q) => q.matmul(x, true),
        }
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
