//! Attention of a prompt chunk's queries on the CPU: MLX's composition
//! (`q · scale`, a matmul against the keys, the masked softmax, a matmul
//! against the values, grouped-query heads broadcast as MLX's own CPU
//! attention broadcasts them) with the masked softmax as one operation of
//! ours on rayon's pool. MLX runs the mask's `where` and the softmax on its
//! stream thread alone, the softmax with a scalar `exp` and an `fmaf` call
//! per value: about a fifth of a 512-token prompt on two cores, a third of a
//! 2048-token one. Here each row's mask is read where it is needed, no
//! masked score is exponentiated, and the rest are exponentiated by MLX's
//! own `exp` algorithm in vector registers: the probabilities are MLX's bit
//! for bit.

use std::sync::Arc;

use mlx_core::cpu_kernel::{cpu_kernel, CpuKernelFn};
use mlx_core::{Array, Dtype};
use multiversion::multiversion;
use rayon::prelude::*;

use mlx_core::cpu_kernel::{floats, floats_mut};

/// `softmax(q · scale @ kᵀ, masked) @ v` for float32 queries `[B, Hq, L,
/// D]` and keys and values `[B, Hkv, S, D]` (Hq a multiple of Hkv).
pub(crate) fn attend(
    q: &Array,
    keys: &Array,
    values: &Array,
    scale: f32,
    mask: RowMask<'_>,
) -> mlx_core::Result<Array> {
    let shape = q.shape();
    let &[b, query_heads, l, d] = shape.as_slice() else {
        return Err(mlx_core::Error::Host(format!(
            "attention of queries shaped {shape:?}"
        )));
    };
    let kv_heads = keys.dim(1)?;
    let repeats = query_heads / kv_heads.max(1);
    let q = q.multiply(&Array::scalar(f64::from(scale), Dtype::Float32)?)?;
    let (q, keys, values) = if repeats > 1 {
        (
            q.reshape(&[b, kv_heads, repeats, l, d])?,
            keys.expand_dims(&[2])?,
            values.expand_dims(&[2])?,
        )
    } else {
        (q, keys.clone(), values.clone())
    };
    let scores = q.matmul(&keys.swapaxes(-1, -2)?)?;
    let weights = masked_softmax(&scores, mask)?;
    weights.matmul(&values)?.reshape(&[b, query_heads, l, d])
}

/// Rows of scores per rayon task at least.
const MIN_ROWS_PER_TASK: usize = 8;

/// Which keys each query sees.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RowMask<'a> {
    /// Every key.
    All,
    /// Query i of L sees keys up to i + (S − L).
    Causal,
    /// A boolean `[L, S]` array: true where the query sees the key.
    Array(&'a Array),
}

/// The softmax over the last axis of float32 `scores` `[..., L, S]` (`L`
/// queries against `S` keys, any leading axes), each row's unseen keys
/// taking probability 0. A row that sees no key comes out NaN, as MLX's
/// does.
pub(crate) fn masked_softmax(scores: &Array, mask: RowMask<'_>) -> mlx_core::Result<Array> {
    let shape = scores.shape();
    let (&keys, rest) = shape
        .split_last()
        .ok_or_else(|| mlx_core::Error::Host("softmax of a scalar".into()))?;
    let queries = rest.last().copied().unwrap_or(1);
    let (keys, queries) = (keys.max(0) as usize, queries.max(0) as usize);
    let mask_array = match mask {
        RowMask::Array(m) => {
            if m.dtype() != Dtype::Bool || m.shape() != [queries as i32, keys as i32] {
                return Err(mlx_core::Error::Host(format!(
                    "a {:?} {:?} mask for {queries} queries against {keys} keys",
                    m.dtype(),
                    m.shape()
                )));
            }
            Some(m)
        }
        RowMask::All | RowMask::Causal => None,
    };
    let causal = matches!(mask, RowMask::Causal);
    let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
        let scores = floats(inputs.first().ok_or("a softmax without scores")?)?;
        let seen: Option<&[u8]> = inputs.get(1).copied();
        let out: &mut [f32] = floats_mut(out)?;
        if keys == 0 || scores.len() != out.len() {
            return Ok(());
        }
        out.par_chunks_mut(keys)
            .zip(scores.par_chunks(keys))
            .enumerate()
            .with_min_len(MIN_ROWS_PER_TASK)
            .for_each(|(row, (out, scores))| {
                let query = row % queries.max(1);
                match seen {
                    Some(seen) => {
                        let seen = &seen[query * keys..(query + 1) * keys];
                        softmax_where(scores, seen, out);
                    }
                    None => {
                        let visible = if causal {
                            (query + 1 + keys).saturating_sub(queries).min(keys)
                        } else {
                            keys
                        };
                        softmax_leading(scores, visible, out);
                    }
                }
            });
        Ok(())
    });
    let mut inputs = vec![scores];
    inputs.extend(mask_array);
    cpu_kernel(&inputs, &shape, Dtype::Float32, kernel)
}

/// `out` = the softmax of the first `visible` of `scores`, 0 after them.
#[multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma", "aarch64+neon"))]
fn softmax_leading(scores: &[f32], visible: usize, out: &mut [f32]) {
    if visible == 0 {
        out.fill(f32::NAN);
        return;
    }
    let (seen, unseen) = scores.split_at(visible);
    let max = largest(seen, |_| true);
    for (o, &s) in out.iter_mut().zip(seen) {
        *o = mlx_exp(s - max);
    }
    normalize(&mut out[..visible]);
    out[visible..visible + unseen.len()].fill(0.0);
}

/// `out` = the softmax of `scores` where `seen` is nonzero, 0 elsewhere.
#[multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma", "aarch64+neon"))]
fn softmax_where(scores: &[f32], seen: &[u8], out: &mut [f32]) {
    let max = largest(scores, |i| seen[i] != 0);
    for ((o, &s), &v) in out.iter_mut().zip(scores).zip(seen) {
        *o = if v != 0 { mlx_exp(s - max) } else { 0.0 };
    }
    normalize(out);
}

/// The largest of `scores` where `counted(i)`, −∞ if none is (a NaN is
/// passed over; the row's sum turns NaN anyway): in 16 lanes, which the
/// compiler turns into vector instructions (a running `f32::max` stays
/// scalar).
#[inline(always)]
fn largest(scores: &[f32], counted: impl Fn(usize) -> bool) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let whole = scores.len() / LANES * LANES;
    for (c, chunk) in scores[..whole].chunks_exact(LANES).enumerate() {
        for (j, (m, &s)) in lanes.iter_mut().zip(chunk).enumerate() {
            if counted(c * LANES + j) && s > *m {
                *m = s;
            }
        }
    }
    for (i, &s) in scores.iter().enumerate().skip(whole) {
        if counted(i) && s > lanes[0] {
            lanes[0] = s;
        }
    }
    lanes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m })
}

/// Divides `out` by its sum, added in order and inverted once, as MLX's
/// softmax does.
#[inline(always)]
fn normalize(out: &mut [f32]) {
    let inverse = 1.0 / out.iter().fold(0f32, |sum, &e| sum + e);
    for o in out.iter_mut() {
        *o *= inverse;
    }
}

/// `eˣ` as MLX's CPU operations compute it (its `simd::exp`: 2^(x·log₂e)
/// split into an integer power set in the exponent bits and a degree-6
/// polynomial of the fraction, with fused multiply-adds), so that a softmax
/// here is MLX's bit for bit; written to vectorize.
#[inline(always)]
fn mlx_exp(x: f32) -> f32 {
    const POLYNOMIAL: [f32; 6] = [
        1.339_887_4e-3,
        9.618_437e-3,
        5.550_332_5e-2,
        2.402_264_8e-1,
        6.931_472e-1,
        1.0,
    ];
    let y = x * std::f32::consts::LOG2_E;
    let whole = (y + 0.5).floor();
    let fraction = y - whole;
    let p = POLYNOMIAL
        .iter()
        .fold(1.535_336_2e-4f32, |p, &c| p.mul_add(fraction, c));
    // The integer `whole` (within 2²² once clamped) read from the mantissa
    // of `whole + 1.5·2²³`: `as i32` would not vectorize. Values clamped
    // away are replaced below.
    let integer = (whole.clamp(-127.0, 128.0) + 12_582_912.0)
        .to_bits()
        .wrapping_sub(0x4B40_0000);
    let power = f32::from_bits(integer.wrapping_add(127) << 23);
    if x.is_nan() {
        x
    } else if x > 88.0 {
        f32::INFINITY
    } else if x < -88.0 {
        0.0
    } else {
        power * p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_core::fast::{scaled_dot_product_attention, AttentionMask};

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i + seed) * 7919) % 1013) as f32 / 300.0 - 1.7)
            .collect()
    }

    #[test]
    fn attention_gives_mlx_s_for_every_mask() {
        // Four query heads over two key/value heads, 5 queries against 9
        // keys (the last 5 positions of 9), 16 values a head.
        let (hq, hkv, l, s, d) = (4, 2, 5, 9, 16);
        let q =
            Array::from_slice(&values(hq * l * d, 1), &[1, hq as i32, l as i32, d as i32]).unwrap();
        let k = Array::from_slice(
            &values(hkv * s * d, 2),
            &[1, hkv as i32, s as i32, d as i32],
        )
        .unwrap();
        let v = Array::from_slice(
            &values(hkv * s * d, 3),
            &[1, hkv as i32, s as i32, d as i32],
        )
        .unwrap();
        // A window of 3 positions, as the rotating cache masks.
        let seen: Vec<bool> = (0..l * s)
            .map(|i| {
                let (query, key) = (i / s + (s - l), i % s);
                key <= query && key + 3 > query
            })
            .collect();
        let window = Array::from_slice(&seen, &[l as i32, s as i32]).unwrap();
        let scale = 0.25;
        for (ours, theirs, name) in [
            (RowMask::All, AttentionMask::None, "all"),
            (RowMask::Causal, AttentionMask::Causal, "causal"),
            (
                RowMask::Array(&window),
                AttentionMask::Array(&window),
                "window",
            ),
        ] {
            let ours = attend(&q, &k, &v, scale, ours)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let theirs = scaled_dot_product_attention(&q, &k, &v, scale, theirs)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let gap = ours
                .iter()
                .zip(&theirs)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(gap < 1e-5, "{name}: largest gap {gap}");
        }
    }

    #[test]
    fn the_masked_softmax_is_mlx_s_bit_for_bit() {
        // 3 rows of 37 scores (not a whole number of vectors), spread wide
        // enough that some exponentials underflow.
        let (rows, keys) = (3, 37);
        let scores: Vec<f32> = values(rows * keys, 5).iter().map(|v| v * 40.0).collect();
        let scores = Array::from_slice(&scores, &[rows as i32, keys as i32]).unwrap();
        let seen: Vec<bool> = (0..rows * keys).map(|i| (i * 5) % 7 != 0).collect();
        let mask = Array::from_slice(&seen, &[rows as i32, keys as i32]).unwrap();
        let minus_infinity = Array::scalar(f64::NEG_INFINITY, Dtype::Float32).unwrap();
        let masked = mlx_core::where_(&mask, &scores, &minus_infinity).unwrap();
        let causal: Vec<bool> = (0..rows * keys)
            .map(|i| i % keys <= keys - rows + i / keys)
            .collect();
        let causal = Array::from_slice(&causal, &[rows as i32, keys as i32]).unwrap();
        let causal_masked = mlx_core::where_(&causal, &scores, &minus_infinity).unwrap();
        for (ours, theirs, name) in [
            (RowMask::All, scores.clone(), "all"),
            (RowMask::Array(&mask), masked, "array"),
            (RowMask::Causal, causal_masked, "causal"),
        ] {
            let ours = masked_softmax(&scores, ours)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let theirs = theirs
                .softmax(&[-1], true)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&ours), bits(&theirs), "{name}");
            assert!(
                ours.contains(&0.0) && ours.iter().any(|&p| p > 0.5),
                "{name}: {ours:?}"
            );
        }
    }

    #[test]
    fn a_row_that_sees_no_key_is_nan() {
        let scores = Array::from_slice(&[1f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
        let mask = Array::from_slice(&[true, false, false, false], &[2, 2]).unwrap();
        let p = masked_softmax(&scores, RowMask::Array(&mask))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(&p[..2], &[1.0, 0.0]);
        assert!(p[2..].iter().all(|v| v.is_nan()), "{p:?}");
    }
}
