//! Comparing two sets of logits laid out `[positions, vocab]`.

use std::fmt;

/// The largest absolute difference between two sets of logits, and where it is.
#[derive(Debug, Clone, Copy)]
pub struct MaxDiff {
    /// max |ours − theirs| (infinite when either side has a NaN there).
    pub value: f32,
    /// The position (row) where it occurs.
    pub position: usize,
    /// The token (column) where it occurs.
    pub token: usize,
    /// Our logit there.
    pub ours: f32,
    /// The reference logit there.
    pub theirs: f32,
    /// The largest |logit| of the reference, for scale.
    pub scale: f32,
}

impl fmt::Display for MaxDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "max |Δlogit| = {:.3e} at position {}, token {} (ours {}, mlx-lm {}; largest |logit| {:.2})",
            self.value, self.position, self.token, self.ours, self.theirs, self.scale
        )
    }
}

/// Compares `ours` with `theirs`, both row-major `[positions, vocab]`.
pub fn max_abs_diff(ours: &[f32], theirs: &[f32], vocab: usize) -> MaxDiff {
    assert_eq!(
        ours.len(),
        theirs.len(),
        "logit counts differ: ours {}, mlx-lm {}",
        ours.len(),
        theirs.len()
    );
    assert!(vocab > 0 && ours.len().is_multiple_of(vocab));
    let mut worst = MaxDiff {
        value: -1.0,
        position: 0,
        token: 0,
        ours: 0.0,
        theirs: 0.0,
        scale: 0.0,
    };
    for (i, (&a, &b)) in ours.iter().zip(theirs).enumerate() {
        let d = (a - b).abs();
        let d = if d.is_nan() { f32::INFINITY } else { d };
        worst.scale = worst.scale.max(b.abs());
        if d > worst.value {
            worst = MaxDiff {
                value: d,
                position: i / vocab,
                token: i % vocab,
                ours: a,
                theirs: b,
                scale: worst.scale,
            };
        }
    }
    worst
}

/// Which chunk of a schedule `position` (counted over all chunks) falls in,
/// and its index inside that chunk.
pub fn step_of(position: usize, chunks: &[Vec<u32>]) -> (usize, usize) {
    let mut start = 0;
    for (step, chunk) in chunks.iter().enumerate() {
        if position < start + chunk.len() {
            return (step, position - start);
        }
        start += chunk.len();
    }
    (chunks.len(), position - start)
}

/// KL(p ‖ q) of two rows of logits, in nats.
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let log_softmax = |row: &[f32]| -> Vec<f64> {
        let top = row.iter().fold(f32::MIN, |m, &v| m.max(v)) as f64;
        let sum: f64 = row.iter().map(|&v| (v as f64 - top).exp()).sum();
        row.iter().map(|&v| v as f64 - top - sum.ln()).collect()
    };
    let (p, q) = (log_softmax(p_logits), log_softmax(q_logits));
    p.iter().zip(&q).map(|(lp, lq)| lp.exp() * (lp - lq)).sum()
}
