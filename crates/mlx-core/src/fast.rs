//! MLX's fused kernels: RMS norm, rotary embedding, attention.

use std::ffi::CString;
use std::ptr;

use mlx_sys as sys;

use crate::array::new_array;
use crate::error::{Error, Result};
use crate::Array;

/// `x / rms(x) · weight` over the last axis (no weight: scale 1).
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    let w = weight.map_or(ptr::null_mut(), Array::raw);
    // SAFETY: live or null handles in, new handle out.
    new_array(|out| unsafe { sys::mlx_fast_rms_norm(out, x.raw(), w, eps, ptr::null_mut()) })
}

/// Where rotary positions start.
#[derive(Debug, Clone, Copy)]
pub enum RopeOffset<'a> {
    /// A fixed start, baked into the graph.
    Fixed(i32),
    /// A start held in a scalar integer array (data, not graph shape).
    Dynamic(&'a Array),
}

/// Rotary embedding of the first `dims` features of the last axis of `x`
/// (shape `[..., positions, features]`), with frequencies `base^(-2i/dims)`
/// and positions multiplied by `scale`.
pub fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: f32,
    scale: f32,
    offset: RopeOffset<'_>,
) -> Result<Array> {
    match offset {
        // SAFETY: live handle in, new handle out.
        RopeOffset::Fixed(start) => new_array(|out| unsafe {
            sys::mlx_fast_rope(
                out,
                x.raw(),
                dims,
                traditional,
                base,
                scale,
                start,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        }),
        // SAFETY: live handles in, new handle out.
        RopeOffset::Dynamic(start) => new_array(|out| unsafe {
            sys::mlx_fast_rope_dynamic(
                out,
                x.raw(),
                dims,
                traditional,
                base,
                scale,
                start.raw(),
                ptr::null_mut(),
                ptr::null_mut(),
            )
        }),
    }
}

/// The mask of a scaled-dot-product attention.
#[derive(Debug, Clone, Copy)]
pub enum AttentionMask<'a> {
    /// Every query sees every key.
    None,
    /// Query i sees keys up to i + (keys - queries).
    Causal,
    /// A boolean (true keeps) or additive mask broadcastable to the scores.
    Array(&'a Array),
}

/// `softmax(q @ kᵀ · scale + mask) @ v` with q `[B, Hq, L, D]`, k and v
/// `[B, Hkv, S, D]`; grouped-query attention when Hq is a multiple of Hkv.
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: AttentionMask<'_>,
) -> Result<Array> {
    let (mode, mask_raw) = match mask {
        AttentionMask::None => ("", ptr::null_mut()),
        AttentionMask::Causal => ("causal", ptr::null_mut()),
        AttentionMask::Array(m) => ("", m.raw()),
    };
    let mode = CString::new(mode).map_err(|e| Error::Host(e.to_string()))?;
    // SAFETY: live or null handles and a NUL-terminated string in.
    new_array(|out| unsafe {
        sys::mlx_fast_scaled_dot_product_attention(
            out,
            q.raw(),
            k.raw(),
            v.raw(),
            scale,
            mode.as_ptr(),
            mask_raw,
            ptr::null_mut(),
            ptr::null_mut(),
        )
    })
}
