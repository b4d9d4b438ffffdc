//! Random numbers from explicit keys (reproducible) or MLX's global generator.

use std::ptr;

use mlx_sys as sys;

use crate::array::{new_array, new_arrays2};
use crate::error::Result;
use crate::{Array, Dtype};

fn key_raw(key: Option<&Array>) -> sys::mlx_array {
    key.map_or(ptr::null_mut(), Array::raw)
}

/// A key for the counter-based generator, from a seed.
pub fn key(seed: u64) -> Result<Array> {
    // SAFETY: a plain value in, new handle out.
    new_array(|out| unsafe { sys::mlx_random_key(out, seed) })
}

/// Two independent keys derived from `key`.
pub fn split(key: &Array) -> Result<(Array, Array)> {
    // SAFETY: live handle in, two new handles out.
    new_arrays2(|a, b| unsafe { sys::mlx_random_split(a, b, key.raw(), ptr::null_mut()) })
}

/// Uniform samples in `[low, high)`.
pub fn uniform(
    low: f32,
    high: f32,
    shape: &[i32],
    dtype: Dtype,
    key: Option<&Array>,
) -> Result<Array> {
    // SAFETY: live or null handle and a valid (pointer, length) pair in.
    new_array(|out| unsafe {
        sys::mlx_random_uniform(
            out,
            low,
            high,
            shape.as_ptr(),
            shape.len(),
            dtype.to_sys(),
            key_raw(key),
            ptr::null_mut(),
        )
    })
}

/// Normal samples with mean `loc` and standard deviation `scale`.
pub fn normal(
    shape: &[i32],
    dtype: Dtype,
    loc: f32,
    scale: f32,
    key: Option<&Array>,
) -> Result<Array> {
    // SAFETY: live or null handle and a valid (pointer, length) pair in.
    new_array(|out| unsafe {
        sys::mlx_random_normal(
            out,
            shape.as_ptr(),
            shape.len(),
            dtype.to_sys(),
            loc,
            scale,
            key_raw(key),
            ptr::null_mut(),
        )
    })
}

/// One index per row drawn from the unnormalized log-probabilities `logits`
/// along `axis`.
pub fn categorical(logits: &Array, axis: i32, key: Option<&Array>) -> Result<Array> {
    // SAFETY: live or null handles in, new handle out.
    new_array(|out| unsafe {
        sys::mlx_random_categorical(out, logits.raw(), axis, key_raw(key), ptr::null_mut())
    })
}
