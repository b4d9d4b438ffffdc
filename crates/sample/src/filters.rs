//! The filters of mlx-lm's `make_sampler`: each sets the log-probability of
//! the tokens it removes to `-inf` and leaves the others unchanged.
//!
//! Every function takes float32 log-probabilities of shape `[1, vocab]`
//! (`vocab >= 1`) and returns a new lazy array of the same shape. Min-p and
//! top-k depend only on differences of log-probabilities, so they accept
//! logits with any constant offset as well.

use mlx_core::{where_, Array, Dtype};

use crate::{check, SampleError};

/// A float32 scalar.
fn scalar(value: f64) -> Result<Array, SampleError> {
    Ok(Array::scalar(value, Dtype::Float32)?)
}

/// `logprobs` with `-inf` wherever `remove` is true.
fn remove_where(remove: &Array, logprobs: &Array) -> Result<Array, SampleError> {
    Ok(where_(remove, &scalar(f64::NEG_INFINITY)?, logprobs)?)
}

/// Nucleus filter: keeps the smallest set of most likely tokens whose
/// probability mass reaches `top_p` of the total (ties with the least likely
/// kept token are kept too). `top_p` in `(0, 1]`.
///
/// As mlx-lm: sort ascending, and drop position `i` when the mass strictly
/// above it is already at least `top_p` times the total.
pub fn apply_top_p(logprobs: &Array, top_p: f32) -> Result<Array, SampleError> {
    check::top_p(top_p)?;
    let vocab = check::logits_row(logprobs)?;
    let sorted = logprobs.sort(-1)?;
    let probs = sorted.exp()?;
    let mass_above = probs.cumsum(-1, true, false)?;
    let first = |a: &Array| a.slice(&[0, 0], &[1, 1], &[1, 1]);
    let total = first(&mass_above)?.add(&first(&probs)?)?;
    let dropped = mass_above.greater_equal(&total.multiply(&scalar(f64::from(top_p))?)?)?;
    // With a positive total at most vocab - 1 positions drop (the mass above
    // the top token is 0); the clip keeps the gather in bounds even for
    // degenerate input whose total mass is 0.
    let count = dropped.astype(Dtype::Int32)?.sum(&[-1], true)?.clip(
        None,
        Some(&Array::scalar(f64::from(vocab - 1), Dtype::Int32)?),
    )?;
    let threshold = sorted.take_along_axis(&count, -1)?;
    remove_where(&logprobs.less(&threshold)?, logprobs)
}

/// Min-p filter: removes tokens whose probability is below `min_p` times the
/// top token's, but never the `min_tokens_to_keep` most likely ones.
/// `min_p` in `[0, 1]`, `min_tokens_to_keep >= 1`.
pub fn apply_min_p(
    logprobs: &Array,
    min_p: f32,
    min_tokens_to_keep: usize,
) -> Result<Array, SampleError> {
    check::probability("min_p", min_p)?;
    check::count("min_tokens_to_keep", min_tokens_to_keep)?;
    let vocab = check::logits_row(logprobs)?;
    let keep = i32::try_from(min_tokens_to_keep).unwrap_or(i32::MAX);
    if keep >= vocab {
        return Ok(logprobs.clone());
    }
    let top = logprobs.max(&[-1], true)?;
    let floor = top.add(&scalar(f64::from(min_p).ln())?)?;
    let mut remove = logprobs.less(&floor)?;
    if keep > 1 {
        let best = logprobs.argpartition(vocab - keep, -1)?.slice(
            &[0, vocab - keep],
            &[1, vocab],
            &[1, 1],
        )?;
        remove = remove.put_along_axis(&best, &Array::scalar(0.0, Dtype::Bool)?, -1)?;
    }
    remove_where(&remove, logprobs)
}

/// Top-k filter: keeps the `top_k` most likely tokens (ties broken
/// arbitrarily, exactly `top_k` kept). `top_k >= 1`; a `top_k` of at least
/// the vocabulary size keeps every token.
pub fn apply_top_k(logprobs: &Array, top_k: usize) -> Result<Array, SampleError> {
    check::top_k(top_k)?;
    let vocab = check::logits_row(logprobs)?;
    let k = i32::try_from(top_k).unwrap_or(i32::MAX);
    if k >= vocab {
        return Ok(logprobs.clone());
    }
    let rest =
        logprobs
            .negative()?
            .argpartition(k - 1, -1)?
            .slice(&[0, k], &[1, vocab], &[1, 1])?;
    Ok(logprobs.put_along_axis(&rest, &scalar(f64::NEG_INFINITY)?, -1)?)
}

/// XTC ("exclude top choices"): removes every token whose probability
/// exceeds `threshold` except the least likely of them, and never the ids in
/// `special` (all below the vocabulary size). With fewer than two tokens
/// above the threshold nothing is removed. `threshold` in `[0, 0.5]`. Takes
/// log-probabilities or logits (the probabilities are their softmax).
///
/// As mlx-lm's `apply_xtc`, without its random choice of whether to apply
/// (the sampler draws that: [`crate::SamplerConfig::xtc_probability`]).
pub fn apply_xtc(logprobs: &Array, threshold: f32, special: &[u32]) -> Result<Array, SampleError> {
    check::xtc_threshold(threshold)?;
    let vocab = check::logits_row(logprobs)?;
    let probs = logprobs.softmax(&[-1], true)?;
    let above = probs.greater(&scalar(f64::from(threshold))?)?;
    let least = where_(&above, &probs, &scalar(f64::INFINITY)?)?.min(&[-1], true)?;
    let mut remove = probs.greater(&least)?;
    if !special.is_empty() {
        let ids = special
            .iter()
            .map(|&token| match i32::try_from(token) {
                Ok(id) if id < vocab => Ok(id),
                _ => Err(SampleError::XtcTokenOutOfVocab { token, vocab }),
            })
            .collect::<Result<Vec<i32>, _>>()?;
        let ids = Array::from_slice(&ids, &[1, ids.len() as i32])?;
        remove = remove.put_along_axis(&ids, &Array::scalar(0.0, Dtype::Bool)?, -1)?;
    }
    remove_where(&remove, logprobs)
}
