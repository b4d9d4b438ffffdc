//! Logits processors, as mlx-lm's `make_logits_processors` builds them: logit
//! bias, then the repetition, presence and frequency penalties over a window
//! of recent tokens.
//!
//! Every function takes float32 logits of shape `[1, vocab]` and returns new
//! logits of the same shape, built lazily on the device. `window` is a 1-d
//! int32 or uint32 array of recent token ids (repeats allowed), each below
//! `vocab`: ids are device data and cannot be checked without a read-back.

use mlx_core::{where_, Array, Dtype};

use crate::{check, SampleError};

/// The last `window` entries of a 1-d array of token ids (all of them when
/// it is shorter): the window the penalties look at.
pub fn last_tokens(ids: &Array, window: usize) -> mlx_core::Result<Array> {
    let n = ids.dim(0)?;
    let window = i32::try_from(window).unwrap_or(i32::MAX);
    if n <= window {
        return Ok(ids.clone());
    }
    ids.slice(&[n - window], &[n], &[1])
}

/// `window` as a `[1, k]` index row, for gathers and scatters along the vocabulary axis.
fn index_row(window: &Array) -> Result<Array, SampleError> {
    Ok(window.reshape(&[1, -1])?)
}

/// A float32 scalar.
fn scalar(value: f32) -> Result<Array, SampleError> {
    Ok(Array::scalar(f64::from(value), Dtype::Float32)?)
}

/// Divides the positive logits and multiplies the negative ones of the tokens
/// in `window` by `penalty`, once per distinct token.
pub fn apply_repetition_penalty(
    logits: &Array,
    window: &Array,
    penalty: f32,
) -> Result<Array, SampleError> {
    check::repetition_penalty(penalty)?;
    check::logits_row(logits)?;
    let index = index_row(window)?;
    let picked = logits.take_along_axis(&index, -1)?;
    let penalty = scalar(penalty)?;
    let penalized = where_(
        &picked.less(&scalar(0.0)?)?,
        &picked.multiply(&penalty)?,
        &picked.divide(&penalty)?,
    )?;
    Ok(logits.put_along_axis(&index, &penalized, -1)?)
}

/// Subtracts `penalty` once from the logit of every distinct token in `window`.
pub fn apply_presence_penalty(
    logits: &Array,
    window: &Array,
    penalty: f32,
) -> Result<Array, SampleError> {
    check::additive_penalty("presence_penalty", penalty)?;
    check::logits_row(logits)?;
    let index = index_row(window)?;
    let picked = logits.take_along_axis(&index, -1)?;
    Ok(logits.put_along_axis(&index, &picked.subtract(&scalar(penalty)?)?, -1)?)
}

/// Subtracts `penalty` from a token's logit once per occurrence in `window`.
pub fn apply_frequency_penalty(
    logits: &Array,
    window: &Array,
    penalty: f32,
) -> Result<Array, SampleError> {
    check::additive_penalty("frequency_penalty", penalty)?;
    check::logits_row(logits)?;
    let index = index_row(window)?;
    // Occurrences of each window entry's token: a row sum of the k × k
    // equality matrix. Repeated entries get equal values, so the scatter
    // writes the same number for every copy.
    let same = window.reshape(&[-1, 1])?.equal(&index)?;
    let counts = same
        .astype(Dtype::Float32)?
        .sum(&[1], false)?
        .reshape(&[1, -1])?;
    let picked = logits.take_along_axis(&index, -1)?;
    let penalized = picked.subtract(&counts.multiply(&scalar(penalty)?)?)?;
    Ok(logits.put_along_axis(&index, &penalized, -1)?)
}

/// Fixed additive biases for some token ids, with the biases of a repeated id summed.
#[derive(Debug, Clone)]
pub struct LogitBias {
    /// The distinct token ids, `[1, m]` uint32.
    tokens: Array,
    /// The summed bias of each id, `[1, m]` float32.
    biases: Array,
    /// The distinct (token id, summed bias) pairs, ascending by id (never
    /// empty): the last holds the largest id, checked against the
    /// vocabulary on every use.
    pairs: Vec<(u32, f32)>,
}

impl LogitBias {
    /// The bias for `pairs` of (token id, bias); `None` when `pairs` is empty.
    pub fn new(pairs: &[(u32, f32)]) -> Result<Option<LogitBias>, SampleError> {
        check::logit_bias(pairs)?;
        let mut merged: Vec<(u32, f32)> = pairs.to_vec();
        merged.sort_by_key(|&(token, _)| token);
        merged.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 += later.1;
            }
            same
        });
        if merged.is_empty() {
            return Ok(None);
        }
        let count = i32::try_from(merged.len()).map_err(|_| SampleError::InvalidSetting {
            field: "logit_bias",
            value: format!("{} entries", merged.len()),
            expected: "at most 2147483647 distinct tokens",
        })?;
        let (ids, values): (Vec<u32>, Vec<f32>) = merged.iter().copied().unzip();
        Ok(Some(LogitBias {
            tokens: Array::from_slice(&ids, &[1, count])?,
            biases: Array::from_slice(&values, &[1, count])?,
            pairs: merged,
        }))
    }

    /// The distinct (token id, summed bias) pairs, ascending by id.
    pub fn pairs(&self) -> &[(u32, f32)] {
        &self.pairs
    }

    /// Adds the biases to `logits` (`[1, vocab]` float32).
    pub fn apply(&self, logits: &Array) -> Result<Array, SampleError> {
        let vocab = check::logits_row(logits)?;
        if let Some(&(token, _)) = self
            .pairs
            .last()
            .filter(|&&(t, _)| i64::from(t) >= i64::from(vocab))
        {
            return Err(SampleError::BiasTokenOutOfVocab { token, vocab });
        }
        let picked = logits.take_along_axis(&self.tokens, -1)?;
        Ok(logits.put_along_axis(&self.tokens, &picked.add(&self.biases)?, -1)?)
    }
}
