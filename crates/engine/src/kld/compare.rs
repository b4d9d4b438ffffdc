//! Comparing two next-token distributions per position, on the device; only
//! a few numbers per position come back to the host.

use mlx_core::{Array, Dtype, Function};

use crate::error::GenerateError;
use crate::kld::cpu_rows;
use crate::kld::stats::PositionSamples;

/// Log-probabilities `logits − logsumexp(logits)` over the last axis, in float32.
pub fn log_softmax(logits: &Array) -> Result<Array, GenerateError> {
    let x = logits.astype(Dtype::Float32)?;
    Ok(x.subtract(&cpu_rows::logsumexp_rows(&x)?)?)
}

/// The reference side of a chunk, computed once and compared with every candidate.
#[derive(Debug)]
pub struct Reference {
    /// Log-probabilities `[L, V]`.
    pub logprobs: Array,
    /// Probabilities `exp(logprobs)` `[L, V]`, computed once for every
    /// candidate.
    pub probs: Array,
    /// Top token per position `[L]`.
    pub top: Array,
}

impl Reference {
    /// Prepares reference logits `[L, V]`.
    pub fn new(logits: &Array) -> Result<Reference, GenerateError> {
        let logprobs = log_softmax(logits)?;
        let probs = cpu_rows::exp(&logprobs)?;
        let top = cpu_rows::argmax_rows(&logprobs)?;
        mlx_core::eval(&[&logprobs, &probs, &top])?;
        Ok(Reference {
            logprobs,
            probs,
            top,
        })
    }
}

thread_local! {
    /// `p · (lr − (z − lse))`, the per-token KL terms of reference
    /// probabilities `p` and log-probabilities `lr` against candidate logits
    /// `z` with row log-sum-exp `lse`, compiled into one fused kernel (the same operations
    /// as computing the candidate's log-probabilities first, without writing
    /// the intermediate `[L, V]` arrays). Compiled once per thread: MLX's
    /// compile caches are per thread.
    static KL_TERMS: Result<Function, String> = Function::new(|xs: &[Array]| match xs {
        [p, lr, z, lse] => Ok(vec![p.multiply(&lr.subtract(&z.subtract(lse)?)?)?]),
        _ => Err(mlx_core::Error::Host(format!("KL terms take 4 arrays, got {}", xs.len()))),
    })
    .and_then(|f| f.compile(true))
    .map_err(|e| e.to_string());
}

/// Per-token KL terms through the compiled kernel.
fn kl_terms(p: &Array, lr: &Array, z: &Array, lse: &Array) -> Result<Array, GenerateError> {
    KL_TERMS.with(|f| {
        let f = f
            .as_ref()
            .map_err(|e| GenerateError::Input(format!("compiling the KL terms: {e}")))?;
        f.call(&[p, lr, z, lse])?
            .pop()
            .ok_or_else(|| GenerateError::Input("the KL terms kernel returned nothing".into()))
    })
}

/// Adds to `samples` the positions `first..L-1` of candidate logits `[L, V]`
/// against `reference`; `next` `[L-1]` (int32) holds each position's actual
/// next token.
pub fn compare_into(
    reference: &Reference,
    candidate_logits: &Array,
    next: &Array,
    first: i32,
    samples: &mut PositionSamples,
) -> Result<(), GenerateError> {
    let shape = candidate_logits.shape();
    let (l, v) = (shape[0], shape[1]);
    // Every row's statistics first (our row operations read whole arrays;
    // a slice of rows would be copied for them), then the scored ones.
    let z_all = candidate_logits.astype(Dtype::Float32)?;
    let lse_all = cpu_rows::logsumexp_rows(&z_all)?;
    let (p_all, lr_all) = (&reference.probs, &reference.logprobs);
    let kld_all = match cpu_rows::kl_rows(p_all, lr_all, &z_all, &lse_all)? {
        Some(kld) => kld,
        None => kl_terms(p_all, lr_all, &z_all, &lse_all)?.sum(&[-1], false)?,
    };
    let scored = |a: &Array| a.slice(&[first], &[l - 1], &[1]);
    let kld = scored(&kld_all)?;
    let same = scored(&reference.top)?.equal(&scored(&cpu_rows::argmax_rows(&z_all)?)?)?;
    let rows = |a: &Array| a.slice(&[first, 0], &[l - 1, v], &[1, 1]);
    let (lr, z) = (rows(lr_all)?, rows(&z_all)?);
    let lse = lse_all.slice(&[first, 0], &[l - 1, 1], &[1, 1])?;
    let next = next.slice(&[first], &[l - 1], &[1])?.reshape(&[-1, 1])?;
    let pick = |a: &Array| -> Result<Array, GenerateError> {
        Ok(a.take_along_axis(&next, -1)?.reshape(&[-1])?)
    };
    let ref_next = pick(&lr)?;
    let cand_next = pick(&z)?.subtract(&lse.reshape(&[-1])?)?;
    mlx_core::eval(&[&kld, &same, &ref_next, &cand_next])?;
    let (kld, same) = (kld.to_vec::<f32>()?, same.to_vec::<bool>()?);
    let (ref_next, cand_next) = (ref_next.to_vec::<f32>()?, cand_next.to_vec::<f32>()?);
    for i in 0..kld.len() {
        samples.push(
            kld[i] as f64,
            same[i],
            ref_next[i] as f64,
            cand_next[i] as f64,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_of_hand_made_distributions() {
        // Position 0: p = [0.5, 0.5, 0], q = [0.25, 0.75, 0]-ish via logits.
        let p = [0.5f32, 0.25, 0.25];
        let q = [0.25f32, 0.5, 0.25];
        let logits = |d: &[f32; 3]| d.iter().map(|x| x.ln()).collect::<Vec<f32>>();
        let mut r = logits(&p);
        r.extend(logits(&p));
        let mut c = logits(&q);
        c.extend(logits(&p));
        let reference = Reference::new(&Array::from_slice(&r, &[2, 3]).unwrap()).unwrap();
        let cand = Array::from_slice(&c, &[2, 3]).unwrap();
        let next = Array::from_slice(&[1i32], &[1]).unwrap();
        let mut samples = PositionSamples::default();
        compare_into(&reference, &cand, &next, 0, &mut samples).unwrap();
        // Only position 0 has a next token inside the chunk.
        assert_eq!(samples.kld.len(), 1);
        let expected = 0.5 * (0.5f64 / 0.25).ln() + 0.25 * (0.25f64 / 0.5).ln() + 0.25 * 0.0;
        assert!(
            (samples.kld[0] - expected).abs() < 1e-6,
            "{} vs {expected}",
            samples.kld[0]
        );
        assert!(!samples.same_top[0]);
        assert!((samples.logp_ref[0] - 0.25f64.ln()).abs() < 1e-6);
        assert!((samples.logp_cand[0] - 0.5f64.ln()).abs() < 1e-6);
    }
}
