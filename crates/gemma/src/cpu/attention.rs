//! One token's attention over float32 keys and values on the CPU, for the
//! CPU decode block (`super::layer`): the query heads that share a
//! key/value head read its keys and values once together, and the
//! positions are split into spans attended on rayon's pool, each with its
//! own softmax maximum and sum, merged at the end (the split-softmax merge
//! of flash decoding).

use multiversion::multiversion;
use rayon::prelude::*;

/// Positions per span at least: a span's keys and values (256 positions of
/// 256 float32 values each way: 512 KB) outweigh scheduling it.
const MIN_SPAN: usize = 256;

/// The heads' layout: query heads, key/value heads, values per head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    /// Query heads.
    pub(crate) query: usize,
    /// Key/value heads (dividing `query`).
    pub(crate) kv: usize,
    /// Values per head.
    pub(crate) dim: usize,
}

/// `out` `[query · dim]`: for each query head of `q` `[query · dim]`, the
/// softmax of its scaled scores against the first `valid` positions of its
/// key/value head in `keys` and `values` (`[kv, capacity, dim]`) weighting
/// the values.
pub(crate) fn attend(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    (capacity, valid): (usize, usize),
    heads: Heads,
    scale: f32,
    out: &mut [f32],
) {
    let d = heads.dim;
    let group = heads.query / heads.kv.max(1);
    let spans = valid.div_ceil(MIN_SPAN).max(1);
    let span = valid.div_ceil(spans).max(1);
    let partials: Vec<Partial> = (0..heads.kv * spans)
        .into_par_iter()
        .map(|task| {
            let (h, s) = (task / spans, task % spans);
            let (start, end) = (s * span, ((s + 1) * span).min(valid));
            let base = h * capacity * d;
            Partial::of(
                &q[h * group * d..(h + 1) * group * d],
                &keys[base + start * d..base + end * d],
                &values[base + start * d..base + end * d],
                d,
                scale,
            )
        })
        .collect();
    for (h, parts) in partials.chunks(spans).enumerate() {
        for g in 0..group {
            let max = parts.iter().fold(f32::NEG_INFINITY, |m, p| m.max(p.max[g]));
            let o = &mut out[(h * group + g) * d..(h * group + g + 1) * d];
            o.fill(0.0);
            let mut total = 0.0;
            for p in parts {
                if p.total[g] == 0.0 {
                    continue;
                }
                let weight = (p.max[g] - max).exp();
                total += weight * p.total[g];
                axpy(weight, &p.sum[g * d..(g + 1) * d], o);
            }
            let inverse = 1.0 / total;
            for v in o.iter_mut() {
                *v *= inverse;
            }
        }
    }
}

/// One span's share for each query head of a group: the largest scaled
/// score, the sum of the scores' exponentials less it, and the values
/// weighted by those exponentials.
struct Partial {
    max: Vec<f32>,
    total: Vec<f32>,
    sum: Vec<f32>,
}

impl Partial {
    /// The share of `keys` and `values` (`[n, d]`) for the queries `q`
    /// (`[group, d]`).
    fn of(q: &[f32], keys: &[f32], values: &[f32], d: usize, scale: f32) -> Partial {
        let group = q.len() / d;
        let n = keys.len() / d;
        let mut scores = vec![0f32; group * n];
        for (j, k) in keys.chunks_exact(d).enumerate() {
            for (g, q) in q.chunks_exact(d).enumerate() {
                scores[g * n + j] = dot(q, k) * scale;
            }
        }
        let mut max = vec![f32::NEG_INFINITY; group];
        let mut total = vec![0f32; group];
        for (g, row) in scores.chunks_exact_mut(n.max(1)).enumerate().take(group) {
            max[g] = row.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            for s in row.iter_mut() {
                *s = (*s - max[g]).exp();
                total[g] += *s;
            }
        }
        let mut sum = vec![0f32; group * d];
        for (j, v) in values.chunks_exact(d).enumerate() {
            for (g, acc) in sum.chunks_exact_mut(d).enumerate() {
                axpy(scores[g * n + j], v, acc);
            }
        }
        Partial { max, total, sum }
    }
}

/// `Σ a_i · b_i`, summed in 8 lanes.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `y += a · x`.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attention of each query head, in f64, one position at a time.
    fn reference(
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        cv: (usize, usize),
        h: Heads,
    ) -> Vec<f64> {
        let (capacity, valid) = cv;
        let d = h.dim;
        let group = h.query / h.kv;
        let mut out = vec![0f64; h.query * d];
        for head in 0..h.query {
            let base = (head / group) * capacity * d;
            let scores: Vec<f64> = (0..valid)
                .map(|j| {
                    (0..d)
                        .map(|i| f64::from(q[head * d + i]) * f64::from(keys[base + j * d + i]))
                        .sum::<f64>()
                        * 0.125
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            for (j, s) in scores.iter().enumerate() {
                let p = (s - max).exp() / total;
                for i in 0..d {
                    out[head * d + i] += p * f64::from(values[base + j * d + i]);
                }
            }
        }
        out
    }

    #[test]
    fn split_spans_give_the_attention_of_the_whole() {
        let heads = Heads {
            query: 4,
            kv: 2,
            dim: 64,
        };
        let capacity = 1100;
        let value = |i: usize, m: usize| ((i * m) % 1009) as f32 / 500.0 - 1.0;
        let q: Vec<f32> = (0..4 * 64).map(|i| value(i, 37)).collect();
        let keys: Vec<f32> = (0..2 * capacity * 64).map(|i| value(i, 7919)).collect();
        let values: Vec<f32> = (0..2 * capacity * 64).map(|i| value(i, 104_729)).collect();
        // One span, several, and a last span of one position.
        for valid in [1, 200, 1025] {
            let mut out = vec![0f32; 4 * 64];
            attend(
                &q,
                &keys,
                &values,
                (capacity, valid),
                heads,
                0.125,
                &mut out,
            );
            let exact = reference(&q, &keys, &values, (capacity, valid), heads);
            for (i, (a, b)) in out.iter().zip(&exact).enumerate() {
                assert!(
                    (f64::from(*a) - b).abs() < 1e-5,
                    "{valid} positions, value {i}: {a} against {b}"
                );
            }
        }
    }
}
