//! GGUF block-quantized weight matrices used as stored, on the CPU: one row
//! of activations (decoding) is multiplied by our kernel over the blocks
//! ([`crate::quant::rows_times`]), and so are fewer than
//! [`MIN_INPUTS_FOR_MATMUL`] rows (a short prompt) where the activations
//! enter as 8-bit integers (`mlx-c`'s kernels decoding each tile of weights
//! once for all the rows where the family has one for the type, the Rust
//! kernels otherwise); longer prompts go through
//! MLX's matmul over the matrix dequantized for that product. Embedding
//! rows are dequantized as gathered.

use std::sync::Arc;

use mlx_core::cpu_kernel::{cpu_kernel, CpuKernelFn};
use mlx_core::{Array, Dtype};

use mlx_core::cpu_kernel::floats_mut;

use super::rows::rows_product;
use crate::quant::{dequantize_into, rows_times, Activations, Arithmetic, GgufDtype};

/// Rows of activations from which a product goes through MLX's float32
/// matmul over the dequantized matrix rather than through our integer
/// kernel: on the 2-core AMD EPYC (Zen 3, AVX2) of development, whole
/// prompts of 8 and 32 tokens were read 1.3–1.6× faster through our kernel
/// (no dequantized matrix to write), 64 tokens as fast, and 128–2048
/// tokens up to 1.3× slower (`sgemm` multiplies more per cycle there than
/// our 8-bit products with a scale per 16 values). On a 2-core AVX-512
/// Xeon the 512-bit tiles read 512-token prompts as fast as `sgemm` did,
/// but 8-bit activations in every chunk raised a KLD sweep's mean KLD of
/// `q8_0` caches from 0.00045 to 0.0019: chunks stay in float32.
pub const MIN_INPUTS_FOR_MATMUL: usize = 64;

/// A `[rows, cols]` matrix of GGUF blocks: `bytes` is uint8 `[rows,
/// row_bytes]`, each row whole blocks of `dtype`.
#[derive(Debug, Clone)]
pub struct GgufMatrix {
    /// The blocks as stored, one row of the matrix per row.
    pub bytes: Array,
    /// The block type.
    pub dtype: GgufDtype,
    /// Values per row.
    pub cols: i32,
    /// How a product with one row of activations computes (how the
    /// activations enter, the CPU kernel family).
    pub arithmetic: Arithmetic,
}

impl GgufMatrix {
    /// Rows of the matrix.
    pub fn rows(&self) -> mlx_core::Result<i32> {
        self.bytes.dim(0)
    }

    /// `x @ Wᵀ` in float32 for `x` `[..., cols]`.
    pub fn times(&self, x: &Array) -> mlx_core::Result<Array> {
        let cols = self.cols;
        if x.dim(-1)? != cols {
            return Err(mlx_core::Error::Host(format!(
                "a {dtype} matrix of {cols} columns times inputs of {}",
                x.dim(-1)?,
                dtype = self.dtype
            )));
        }
        let inputs = x.size() / cols.max(1) as usize;
        let arithmetic = self.arithmetic;
        // Short prompts enter as 8-bit activations in every kernel family
        // (the portable one, and types `mlx-c` has no kernel for, on the
        // Rust kernels), so that the families differ only in the order of
        // their float additions.
        let integer_kernel =
            inputs < MIN_INPUTS_FOR_MATMUL && arithmetic.activations == Activations::Int8;
        if inputs != 1 && !integer_kernel {
            let x = if x.dtype() == Dtype::Float32 {
                x.clone()
            } else {
                x.astype(Dtype::Float32)?
            };
            // Evaluated here, so that the dequantized matrix is freed before
            // the next product's is made: left to MLX's order, a block's
            // Q/K/V and gate/up matrices were held together (a 512-token
            // prompt's peak resident memory 345 → 395 MiB).
            let product = x.linear(&self.dequantized()?)?;
            product.eval()?;
            return Ok(product);
        }
        let dtype = self.dtype;
        rows_product(&[&self.bytes], x, self.rows()?, move |w, x, y| {
            rows_times(dtype, w[0], cols as usize, x, y, arithmetic).map_err(|e| e.to_string())
        })
    }

    /// The matrix in float32, `[rows, cols]`.
    pub fn dequantized(&self) -> mlx_core::Result<Array> {
        dequantize_rows(&self.bytes, self.dtype, self.cols)
    }

    /// Rows `indices` in float32, `[..indices, cols]` (an embedding lookup).
    pub fn take_rows(&self, indices: &Array) -> mlx_core::Result<Array> {
        dequantize_rows(&self.bytes.take(indices, 0)?, self.dtype, self.cols)
    }

    /// The matrix made of rows `indices` (any shape), one after another.
    pub fn taken(&self, indices: &Array) -> mlx_core::Result<GgufMatrix> {
        let width = self.bytes.dim(1)?;
        let flat = indices.reshape(&[indices.size() as i32])?;
        Ok(GgufMatrix {
            bytes: self
                .bytes
                .take(&flat, 0)?
                .reshape(&[flat.size() as i32, width])?,
            dtype: self.dtype,
            cols: self.cols,
            arithmetic: self.arithmetic,
        })
    }

    /// The matrix made of rows `start..end`.
    pub fn row_range(&self, start: i32, end: i32) -> mlx_core::Result<GgufMatrix> {
        let width = self.bytes.dim(1)?;
        Ok(GgufMatrix {
            bytes: self.bytes.slice(&[start, 0], &[end, width], &[1, 1])?,
            dtype: self.dtype,
            cols: self.cols,
            arithmetic: self.arithmetic,
        })
    }
}

/// Block rows `bytes` `[..., row_bytes]` of `dtype` as float32 `[..., cols]`.
fn dequantize_rows(bytes: &Array, dtype: GgufDtype, cols: i32) -> mlx_core::Result<Array> {
    let mut shape = bytes.shape();
    if let Some(last) = shape.last_mut() {
        *last = cols;
    }
    let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
        let out = floats_mut(out)?;
        let bytes = inputs.first().ok_or("dequantizing without an input")?;
        dequantize_into(dtype, bytes, out).map_err(|e| e.to_string())
    });
    cpu_kernel(&[bytes], &shape, Dtype::Float32, kernel)
}
