//! MLX affine quantization: `w ≈ scale · q + bias` per group of the last axis.

use std::ptr;

use mlx_sys as sys;

use crate::array::{new_array, new_arrays3};
use crate::error::Result;
use crate::Array;

/// A quantized matrix: packed `uint32` values with per-group scales and biases.
#[derive(Debug, Clone)]
pub struct QuantizedArray {
    /// Packed values, `32 / bits` per `uint32` along the last axis.
    pub packed: Array,
    /// One scale per group.
    pub scales: Array,
    /// One bias per group.
    pub biases: Array,
    /// Elements per group (32, 64 or 128).
    pub group_size: i32,
    /// Bits per element (2, 3, 4, 5, 6 or 8).
    pub bits: i32,
}

/// Quantizes the last axis of `w` in groups of `group_size` with `bits` bits.
pub fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<QuantizedArray> {
    // SAFETY: live handle in, three new handles out.
    let (packed, scales, biases) = new_arrays3(|a, b, c| unsafe {
        sys::mlx_quantize(a, b, c, w.raw(), group_size, bits, ptr::null_mut())
    })?;
    Ok(QuantizedArray {
        packed,
        scales,
        biases,
        group_size,
        bits,
    })
}

impl QuantizedArray {
    /// The full-precision matrix these values stand for.
    pub fn dequantize(&self) -> Result<Array> {
        // SAFETY: live handles in, new handle out.
        new_array(|out| unsafe {
            sys::mlx_dequantize(
                out,
                self.packed.raw(),
                self.scales.raw(),
                self.biases.raw(),
                self.group_size,
                self.bits,
                ptr::null_mut(),
            )
        })
    }

    /// `x @ selfᵀ` (`transpose`) or `x @ self`, computed on the packed data.
    pub fn matmul(&self, x: &Array, transpose: bool) -> Result<Array> {
        // SAFETY: live handles in, new handle out.
        new_array(|out| unsafe {
            sys::mlx_quantized_matmul(
                out,
                x.raw(),
                self.packed.raw(),
                self.scales.raw(),
                self.biases.raw(),
                transpose,
                self.group_size,
                self.bits,
                ptr::null_mut(),
            )
        })
    }

    /// Bytes held by the packed values, scales and biases.
    pub fn nbytes(&self) -> usize {
        self.packed.nbytes() + self.scales.nbytes() + self.biases.nbytes()
    }
}
