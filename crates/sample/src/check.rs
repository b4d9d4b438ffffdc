//! Checks of single settings and of the logits' shape, shared by
//! `SamplerConfig::validate`, the sampler and the public filter and
//! processor functions.

use mlx_core::Array;

use crate::SampleError;

/// An error for `field` holding `value`, which lies outside `expected`.
fn invalid(field: &'static str, value: impl ToString, expected: &'static str) -> SampleError {
    SampleError::InvalidSetting {
        field,
        value: value.to_string(),
        expected,
    }
}

/// Whether `n` is a count in `[1, i32::MAX]`, the range of MLX axis sizes.
fn is_count(n: usize) -> bool {
    (1..=i32::MAX as usize).contains(&n)
}

/// `temperature`: finite and `>= 0`.
pub(crate) fn temperature(t: f32) -> Result<(), SampleError> {
    if t.is_finite() && t >= 0.0 {
        return Ok(());
    }
    Err(invalid(
        "temperature",
        t,
        "must be finite and >= 0 (0 = greedy)",
    ))
}

/// `top_k`: in `[1, i32::MAX]`.
pub(crate) fn top_k(k: usize) -> Result<(), SampleError> {
    if is_count(k) {
        return Ok(());
    }
    Err(invalid(
        "top_k",
        k,
        "must be in [1, 2147483647] (leave it unset to turn it off)",
    ))
}

/// `top_p`: in `(0, 1]`.
pub(crate) fn top_p(p: f32) -> Result<(), SampleError> {
    if p > 0.0 && p <= 1.0 {
        return Ok(());
    }
    Err(invalid("top_p", p, "must be in (0, 1]"))
}

/// A probability setting (`field`: `min_p`, `xtc_probability`): in `[0, 1]`.
pub(crate) fn probability(field: &'static str, p: f32) -> Result<(), SampleError> {
    if (0.0..=1.0).contains(&p) {
        return Ok(());
    }
    Err(invalid(field, p, "must be in [0, 1]"))
}

/// A count setting (`field`: `min_tokens_to_keep`, a penalty's window): in
/// `[1, i32::MAX]`.
pub(crate) fn count(field: &'static str, n: usize) -> Result<(), SampleError> {
    if is_count(n) {
        return Ok(());
    }
    Err(invalid(field, n, "must be in [1, 2147483647]"))
}

/// `repetition_penalty`: finite and `> 0`.
pub(crate) fn repetition_penalty(p: f32) -> Result<(), SampleError> {
    if p.is_finite() && p > 0.0 {
        return Ok(());
    }
    Err(invalid(
        "repetition_penalty",
        p,
        "must be finite and > 0 (1 = no penalty)",
    ))
}

/// `presence_penalty` or `frequency_penalty`: finite.
pub(crate) fn additive_penalty(field: &'static str, p: f32) -> Result<(), SampleError> {
    if p.is_finite() {
        return Ok(());
    }
    Err(invalid(field, p, "must be finite (0 = no penalty)"))
}

/// `xtc_threshold`: in `[0, 0.5]`.
pub(crate) fn xtc_threshold(t: f32) -> Result<(), SampleError> {
    if (0.0..=0.5).contains(&t) {
        return Ok(());
    }
    Err(invalid("xtc_threshold", t, "must be in [0, 0.5]"))
}

/// `logit_bias`: every bias a number or `-inf`.
pub(crate) fn logit_bias(pairs: &[(u32, f32)]) -> Result<(), SampleError> {
    match pairs
        .iter()
        .find(|(_, b)| b.is_nan() || *b == f32::INFINITY)
    {
        None => Ok(()),
        Some(&(token, bias)) => Err(invalid(
            "logit_bias",
            format!("{bias} for token {token}"),
            "each bias must be a number or -inf, not NaN or +inf",
        )),
    }
}

/// The vocabulary size of a `[1, vocab]` float row of logits (`vocab >= 1`).
pub(crate) fn logits_row(logits: &Array) -> Result<i32, SampleError> {
    let shape = logits.shape();
    let dtype = logits.dtype();
    match shape.as_slice() {
        &[1, vocab] if vocab >= 1 && dtype.is_float() => Ok(vocab),
        _ => Err(SampleError::BadLogits { shape, dtype }),
    }
}
