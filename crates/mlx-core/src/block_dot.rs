//! Products of ggml block-quantized rows, and of MLX's affine-quantized
//! rows, with 8-bit activations by `mlx-c`'s AVX2 kernels
//! (`mlx-c/src/block_dot.cpp`), for the formats and CPUs they cover; the
//! caller keeps another path for the rest.

use crate::error::check;
use crate::{Error, Result};

/// Activations quantized to 8 bits per 16 values, one row or several one
/// after another: value `j` ≈ `scales[j / 16] · q[j]`, `sums[g]` the sum
/// of group `g`'s approximations.
#[derive(Debug, Clone, Copy)]
pub struct Int8Activations<'a> {
    /// The integers, each in [−127, 127].
    pub q: &'a [i8],
    /// One scale per 16 values.
    pub scales: &'a [f32],
    /// One sum per 16 values.
    pub sums: &'a [f32],
}

/// Whether [`block_rows_dot`] multiplies rows of ggml type `ggml_type` on
/// this CPU.
pub fn block_rows_dot_available(ggml_type: u32) -> Result<bool> {
    let mut available = false;
    // SAFETY: `available` is a live bool the call writes.
    check(unsafe { mlx_sys::mlx_block_rows_dot_available(&mut available, ggml_type) })?;
    Ok(available)
}

/// `out[m · rows + r] = Σ_j w[r, j] · x[m, j]`: each of the `rows` rows of
/// `w` (ggml type `ggml_type`, `row_bytes` bytes of whole blocks each)
/// against each of the `out.len() / rows` rows of `x` (`x` holding that many
/// rows one after another). Several rows of `x` decode each tile of weights
/// once for all of them. Fails where [`block_rows_dot_available`] says no,
/// or when the sizes do not match the type.
pub fn block_rows_dot(
    ggml_type: u32,
    w: &[u8],
    row_bytes: usize,
    x: Int8Activations<'_>,
    out: &mut [f32],
) -> Result<()> {
    let rows = w.len().checked_div(row_bytes).unwrap_or(0);
    let n = out.len().checked_div(rows).unwrap_or(0);
    let cols = x.q.len().checked_div(n).unwrap_or(0);
    if rows == 0 || out.is_empty() {
        return Ok(());
    }
    if w.len() != rows * row_bytes
        || out.len() != n * rows
        || x.q.len() != n * cols
        || !cols.is_multiple_of(16)
        || x.scales.len() != n * cols / 16
        || x.sums.len() != n * cols / 16
    {
        return Err(Error::Host(format!(
            "block rows product: {} bytes of rows of {row_bytes} bytes for {} outputs, \
             {} activations with {} scales and {} sums",
            w.len(),
            out.len(),
            x.q.len(),
            x.scales.len(),
            x.sums.len()
        )));
    }
    // SAFETY: every pointer comes from a live slice of the length checked
    // above (`rows` rows of `row_bytes` bytes, `n` rows of `cols`
    // activations with `cols / 16` scales and sums each, `n · rows`
    // outputs); the kernel checks that `row_bytes` is `cols` values of its
    // type and reads no further.
    check(unsafe {
        mlx_sys::mlx_block_rows_dot(
            out.as_mut_ptr(),
            ggml_type,
            w.as_ptr(),
            rows,
            row_bytes,
            cols,
            n,
            x.q.as_ptr(),
            x.scales.as_ptr(),
            x.sums.as_ptr(),
        )
    })
}

/// MLX's affine-quantized rows: `bits` (4 or 8) in groups of `group_size`,
/// the packed bytes of each row followed by the next, and float32 scales and
/// biases, one per group.
#[derive(Debug, Clone, Copy)]
pub struct AffineRows<'a> {
    /// The packed values, `cols · bits / 8` bytes a row.
    pub packed: &'a [u8],
    /// One scale per group.
    pub scales: &'a [f32],
    /// One bias per group.
    pub biases: &'a [f32],
    /// Bits per value.
    pub bits: i32,
    /// Values per group.
    pub group_size: i32,
}

/// Whether [`affine_rows_dot`] multiplies `bits`-bit rows in groups of
/// `group_size` on this CPU.
pub fn affine_rows_dot_available(bits: i32, group_size: i32) -> Result<bool> {
    let mut available = false;
    // SAFETY: `available` is a live bool the call writes.
    check(unsafe { mlx_sys::mlx_affine_rows_dot_available(&mut available, bits, group_size) })?;
    Ok(available)
}

/// `out[r] = Σ_j w[r, j] · x_j` for each of the `out.len()` rows of `w`
/// against `x`. Fails where [`affine_rows_dot_available`] says no, or when
/// the sizes do not match.
pub fn affine_rows_dot(w: AffineRows<'_>, x: Int8Activations<'_>, out: &mut [f32]) -> Result<()> {
    let (rows, cols) = (out.len(), x.q.len());
    let bits = usize::try_from(w.bits).unwrap_or(0);
    let group = usize::try_from(w.group_size).unwrap_or(0);
    let fits = bits > 0
        && group > 0
        && cols.is_multiple_of(group)
        && cols.is_multiple_of(16)
        && w.packed.len() == rows * cols * bits / 8
        && w.scales.len() == rows * cols / group
        && w.biases.len() == w.scales.len()
        && x.scales.len() == cols / 16
        && x.sums.len() == cols / 16;
    if !fits {
        return Err(Error::Host(format!(
            "affine rows product: {} packed bytes, {} scales and {} biases of {bits}-bit \
             groups of {group} for {rows} rows of {cols} activations",
            w.packed.len(),
            w.scales.len(),
            w.biases.len()
        )));
    }
    // SAFETY: every pointer comes from a live slice of the length checked
    // above for `rows` rows of `cols` values; the kernel reads no further.
    check(unsafe {
        mlx_sys::mlx_affine_rows_dot(
            out.as_mut_ptr(),
            w.bits,
            w.group_size,
            w.packed.as_ptr(),
            w.scales.as_ptr(),
            w.biases.as_ptr(),
            rows,
            cols,
            x.q.as_ptr(),
            x.scales.as_ptr(),
            x.sums.as_ptr(),
        )
    })
}
