//! RMSNorm and RoPE on the CPU: the arithmetic of one token's block
//! ([`crate::cpu::layer`]), and for the rows of a prompt chunk the q/k
//! norms with RoPE ([`qk_norm_rope`]) and the residual norms
//! ([`residual_norms`]) as one operation of ours each on rayon's pool.
//! MLX runs those as about a dozen elementwise operations on its stream
//! thread alone (transposes, squares, sums, RoPE's sines and cosines per
//! call): 86 of 470 ms of a 256-token chunk of the default model on two
//! cores (docs/performance.md).

use std::sync::{Arc, Mutex};

use mlx_core::cpu_kernel::{cpu_kernel, floats, floats_mut, CpuKernelFn};
use mlx_core::{Array, Dtype};
use rayon::prelude::*;

use super::attention::dot;

/// Rows handed to one rayon task at least.
const MIN_ROWS_PER_TASK: usize = 16;

/// `w · x / √(mean(x²) + eps)`.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    rms_norm_in_place(&mut out, w, eps);
    out
}

/// [`rms_norm`] in place.
pub(crate) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let inverse = 1.0 / (dot(x, x) / x.len().max(1) as f32 + eps).sqrt();
    for (v, w) in x.iter_mut().zip(w) {
        *v = w * (*v * inverse);
    }
}

/// RoPE's cosines and sines at one position, for vectors whose halves
/// rotate together (MLX's non-traditional layout).
pub(crate) struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// The table of `position` (already scaled) for `dim`-wide vectors.
    pub(crate) fn new(position: f32, base: f32, dim: usize) -> RopeTable {
        let half = dim / 2;
        let (cos, sin) = (0..half)
            .map(|i| {
                let frequency = (-(i as f32) / half as f32 * base.log2()).exp2();
                let theta = position * frequency;
                (theta.cos(), theta.sin())
            })
            .unzip();
        RopeTable { cos, sin }
    }

    /// Rotates `x` in place.
    pub(crate) fn apply(&self, x: &mut [f32]) {
        let (a, b) = x.split_at_mut(self.cos.len());
        for (((a, b), c), s) in a.iter_mut().zip(b).zip(&self.cos).zip(&self.sin) {
            let (x1, x2) = (*a, *b);
            *a = x1 * c - x2 * s;
            *b = x1 * s + x2 * c;
        }
    }
}

/// Where a chunk's rows sit for RoPE: the first row's position, how many
/// rows, and the rotation's base, position multiplier and width.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RopeRows {
    /// The first row's position.
    pub(crate) start: i32,
    /// Rows (positions `start..start + rows`).
    pub(crate) rows: usize,
    /// Frequency base.
    pub(crate) base: f32,
    /// Position multiplier (1 / linear scaling factor).
    pub(crate) scale: f32,
    /// Values per head.
    pub(crate) dim: usize,
}

/// The tables of the last chunks' rows: a chunk's layers share two (the
/// sliding layers' base and the global one), so each is computed once per
/// chunk, not once per layer.
static RECENT_TABLES: Mutex<Vec<(RopeRows, Arc<Vec<RopeTable>>)>> = Mutex::new(Vec::new());

/// Tables kept in [`RECENT_TABLES`]: a chunk's two. Each holds 8 bytes per
/// row and head value (2 MB for a chunk of 1024 rows of 256 values), and the
/// last chunk's stay held until the next prompt.
const RECENT_TABLES_KEPT: usize = 2;

/// The tables of `rows`' positions, one per row.
fn tables(rows: RopeRows) -> Arc<Vec<RopeTable>> {
    let mut recent = RECENT_TABLES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, t)) = recent.iter().find(|(r, _)| *r == rows) {
        return Arc::clone(t);
    }
    let made: Arc<Vec<RopeTable>> = Arc::new(
        (0..rows.rows)
            .into_par_iter()
            .map(|i| {
                RopeTable::new(
                    (rows.start + i as i32) as f32 * rows.scale,
                    rows.base,
                    rows.dim,
                )
            })
            .collect(),
    );
    if recent.len() >= RECENT_TABLES_KEPT {
        recent.remove(0);
    }
    recent.push((rows, Arc::clone(&made)));
    made
}

/// Float32 queries `q` `[B, L, Hq·D]` and keys `k` `[B, L, Hkv·D]` of
/// `rope.rows` = L rows each: every head RMS-normed (`q_norm`, `k_norm`)
/// and rotated at its row's position, as `[B, Hq, L, D]` and `[B, Hkv, L,
/// D]`. `None` for other dtypes or shapes (MLX's operations then serve).
pub(crate) fn qk_norm_rope(
    q: &Array,
    k: &Array,
    (q_norm, k_norm): (&Array, &Array),
    (hq, hkv): (i32, i32),
    rope: RopeRows,
    eps: f32,
) -> mlx_core::Result<Option<(Array, Array)>> {
    let q = heads_norm_rope(q, q_norm, hq, rope, eps)?;
    let k = heads_norm_rope(k, k_norm, hkv, rope, eps)?;
    Ok(q.zip(k))
}

/// [`qk_norm_rope`] of one of them, `x` `[B, L, heads·D]` with its norm
/// `[D]`: its own output, so that a cache keeping the keys keeps nothing
/// else alive.
fn heads_norm_rope(
    x: &Array,
    norm: &Array,
    heads: i32,
    rope: RopeRows,
    eps: f32,
) -> mlx_core::Result<Option<Array>> {
    let d = rope.dim as i32;
    let (b, l) = (x.dim(0)?, x.dim(1)?);
    if x.dtype() != Dtype::Float32
        || norm.dtype() != Dtype::Float32
        || x.shape() != [b, l, heads * d]
        || norm.shape() != [d]
        || l as usize != rope.rows
        || d % 2 != 0
    {
        return Ok(None);
    }
    let tables = tables(rope);
    let (count, rows, dim) = (heads as usize, rope.rows, rope.dim);
    let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
        let [x, norm] = inputs else {
            return Err(format!(
                "a norm and RoPE take 2 inputs, got {}",
                inputs.len()
            ));
        };
        let (x, norm) = (floats(x)?, floats(norm)?);
        let out = floats_mut(out)?;
        out.par_chunks_mut(dim)
            .enumerate()
            .with_min_len(MIN_ROWS_PER_TASK)
            .for_each(|(i, vector)| {
                let (row, head) = (i % rows, (i / rows) % count);
                let batch_row = (i / (rows * count)) * rows + row;
                let start = (batch_row * count + head) * dim;
                vector.copy_from_slice(&x[start..start + dim]);
                rms_norm_in_place(vector, norm, eps);
                tables[row].apply(vector);
            });
        Ok(())
    });
    cpu_kernel(&[x, norm], &[b, heads, l, d], Dtype::Float32, kernel).map(Some)
}

/// The block's residual step over float32 rows: `h = x + rms_norm(r,
/// w_post)` and `rms_norm(h, w_next)`, as two views of one output; `None`
/// for other dtypes or shapes (MLX's operations then serve).
pub(crate) fn residual_norms(
    x: &Array,
    r: &Array,
    w_post: &Array,
    w_next: &Array,
    eps: f32,
) -> mlx_core::Result<Option<(Array, Array)>> {
    let shape = x.shape();
    let hidden = shape.last().copied().unwrap_or(0);
    let float32 = [x, r, w_post, w_next]
        .iter()
        .all(|a| a.dtype() == Dtype::Float32);
    if !float32
        || hidden == 0
        || r.shape() != shape
        || w_post.shape() != [hidden]
        || w_next.shape() != [hidden]
    {
        return Ok(None);
    }
    let width = hidden as usize;
    let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
        let [x, r, w_post, w_next] = inputs else {
            return Err(format!(
                "residual norms take 4 inputs, got {}",
                inputs.len()
            ));
        };
        let (x, r) = (floats(x)?, floats(r)?);
        let (w_post, w_next) = (floats(w_post)?, floats(w_next)?);
        let out = floats_mut(out)?;
        let (h, normed) = out.split_at_mut(x.len());
        h.par_chunks_mut(width)
            .zip(normed.par_chunks_mut(width))
            .zip(x.par_chunks(width).zip(r.par_chunks(width)))
            .with_min_len(MIN_ROWS_PER_TASK)
            .for_each(|((h, normed), (x, r))| {
                h.copy_from_slice(r);
                rms_norm_in_place(h, w_post, eps);
                for (h, x) in h.iter_mut().zip(x) {
                    *h += x;
                }
                normed.copy_from_slice(h);
                rms_norm_in_place(normed, w_next, eps);
            });
        Ok(())
    });
    let rows = (x.size() / width) as i32;
    let both = cpu_kernel(
        &[x, r, w_post, w_next],
        &[2, rows, hidden],
        Dtype::Float32,
        kernel,
    )?;
    let half = |i: i32| -> mlx_core::Result<Array> {
        both.slice(&[i, 0, 0], &[i + 1, rows, hidden], &[1, 1, 1])?
            .reshape(&shape)
    };
    Ok(Some((half(0)?, half(1)?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_core::fast::{rms_norm as mlx_rms_norm, rope, RopeOffset};

    /// Deterministic float32 values of `shape`, spread over about ±2.
    fn values(shape: &[i32], seed: u32) -> Array {
        let n: i32 = shape.iter().product();
        let v: Vec<f32> = (0..n as u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 4001) as f32 / 1000.0 - 2.0)
            .collect();
        Array::from_slice(&v, shape).unwrap()
    }

    fn max_difference(a: &Array, b: &Array) -> f32 {
        assert_eq!(a.shape(), b.shape());
        let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn prompt_rows_get_mlx_s_q_k_norms_and_rope() {
        let (b, l, hq, hkv, d) = (2, 5, 2, 1, 64);
        let (q, k) = (values(&[b, l, hq * d], 1), values(&[b, l, hkv * d], 2));
        let (q_norm, k_norm) = (values(&[d], 3), values(&[d], 4));
        let (start, base, scale, eps) = (7, 10_000.0, 0.125, 1e-6);
        let rope_rows = RopeRows {
            start,
            rows: l as usize,
            base,
            scale,
            dim: d as usize,
        };
        let (ours_q, ours_k) = qk_norm_rope(&q, &k, (&q_norm, &k_norm), (hq, hkv), rope_rows, eps)
            .unwrap()
            .expect("float32 rows are taken");
        let theirs = |x: &Array, heads: i32, w: &Array| {
            let x = x
                .reshape(&[b, l, heads, d])
                .unwrap()
                .transpose(&[0, 2, 1, 3])
                .unwrap();
            let normed = mlx_rms_norm(&x, Some(w), eps).unwrap();
            rope(&normed, d, false, base, scale, RopeOffset::Fixed(start)).unwrap()
        };
        let (theirs_q, theirs_k) = (theirs(&q, hq, &q_norm), theirs(&k, hkv, &k_norm));
        assert!(max_difference(&ours_q, &theirs_q) < 2e-5);
        assert!(max_difference(&ours_k, &theirs_k) < 2e-5);
        // A rotation by the wrong position is far off: the comparison sees it.
        let shifted = rope(
            &mlx_rms_norm(
                &k.reshape(&[b, l, hkv, d])
                    .unwrap()
                    .transpose(&[0, 2, 1, 3])
                    .unwrap(),
                Some(&k_norm),
                eps,
            )
            .unwrap(),
            d,
            false,
            base,
            scale,
            RopeOffset::Fixed(start + 8),
        )
        .unwrap();
        assert!(max_difference(&ours_k, &shifted) > 1e-2);
    }

    #[test]
    fn prompt_rows_get_mlx_s_residual_norms() {
        let shape = [1, 6, 48];
        let (x, r) = (values(&shape, 5), values(&shape, 6));
        let (w_post, w_next) = (values(&[48], 7), values(&[48], 8));
        let (h, normed) = residual_norms(&x, &r, &w_post, &w_next, 1e-6)
            .unwrap()
            .expect("float32 rows are taken");
        let theirs_h = x
            .add(&mlx_rms_norm(&r, Some(&w_post), 1e-6).unwrap())
            .unwrap();
        let theirs_normed = mlx_rms_norm(&theirs_h, Some(&w_next), 1e-6).unwrap();
        assert!(max_difference(&h, &theirs_h) < 1e-5);
        assert!(max_difference(&normed, &theirs_normed) < 1e-5);
    }

    #[test]
    fn other_dtypes_are_left_to_mlx() {
        let x = values(&[1, 2, 8], 9).astype(Dtype::Bfloat16).unwrap();
        let w = values(&[8], 10);
        assert!(residual_norms(&x, &x, &w, &w, 1e-6).unwrap().is_none());
    }
}
