//! Filling caches to a context length, and a decode step that can be repeated
//! at that length.

use gemma::cache::{CacheFormat, LayerCache};
use gemma::forward::decode_step::DecodeStep as FixedStep;
use gemma::model::Gemma3;
use mlx_core::Array;

use crate::inputs::{random_tokens, token_array};
use crate::BenchError;

/// Prompt tokens per forward when filling caches (the sliding window of every
/// published size).
pub const PREFILL_CHUNK: usize = 512;

/// Runs `tokens` into `caches` in chunks of `chunk` tokens, computing hidden
/// states only (no logits: they are not needed to fill caches) and evaluating
/// after each chunk.
pub fn prefill(
    model: &Gemma3,
    caches: &mut [LayerCache],
    tokens: &[u32],
    chunk: usize,
) -> Result<(), BenchError> {
    for part in tokens.chunks(chunk.max(1)) {
        let hidden = model.hidden(&token_array(part)?, caches)?;
        eval_with_caches(&hidden, caches)?;
    }
    Ok(())
}

/// The logits `[1, 1, vocab]` of the last prompt position after running the
/// whole prompt into `caches`: what a prompt costs before the first token.
pub fn prompt_logits(
    model: &Gemma3,
    caches: &mut [LayerCache],
    tokens: &[u32],
) -> Result<Array, BenchError> {
    let hidden = model.hidden(&token_array(tokens)?, caches)?;
    let shape = hidden.shape();
    let (l, h) = (shape[1], shape[2]);
    let last = hidden.slice(&[0, l - 1, 0], &[1, l, h], &[1, 1, 1])?;
    let logits = model.logits(&last)?;
    eval_with_caches(&logits, caches)?;
    Ok(logits)
}

/// Evaluates `out` together with every cache array.
fn eval_with_caches(out: &Array, caches: &[LayerCache]) -> Result<(), BenchError> {
    let mut arrays = vec![out];
    arrays.extend(caches.iter().flat_map(LayerCache::arrays));
    Ok(mlx_core::eval(&arrays)?)
}

/// One-token decode steps at a fixed context length.
///
/// After each step every cache that can forget the token does
/// ([`LayerCache::trim`]): global layers always, sliding layers while their
/// window has not wrapped. A wrapped sliding-window cache cannot trim; it
/// keeps the token and stays in its steady state (a full window: the same
/// keys attended to and one slot overwritten per step), so the work per step
/// is unchanged. The caches are not cloned per step: a second reference to
/// their buffers would stop MLX from updating them in place, and every step
/// would copy every cache.
///
/// With `compiled`, the step is [`gemma::forward::decode_step::DecodeStep`] (fixed
/// shapes, compiled by MLX) on caches reserved for one more token.
pub struct DecodeStep<'a> {
    model: &'a Gemma3,
    caches: Vec<LayerCache>,
    token: Array,
    fixed: Option<FixedStep>,
}

impl<'a> DecodeStep<'a> {
    /// Caches of `format` filled with `context` random tokens (from `seed`).
    pub fn new(
        model: &'a Gemma3,
        format: CacheFormat,
        context: usize,
        seed: u64,
        compiled: bool,
    ) -> Result<DecodeStep<'a>, BenchError> {
        let vocab = model.config.vocab_size;
        let tokens = random_tokens(context + 1, vocab, seed)?;
        let (prompt, next) = tokens.split_at(context);
        let mut caches = model.make_caches(format)?;
        prefill(model, &mut caches, prompt, PREFILL_CHUNK)?;
        let fixed = if compiled {
            let step = FixedStep::new(model, true)?;
            if !step.reserve(&mut caches, context as i32 + 1)? {
                return Err(BenchError::Settings(
                    "a compiled decode step needs a float KV cache".into(),
                ));
            }
            Some(step)
        } else {
            None
        };
        Ok(DecodeStep {
            model,
            caches,
            token: token_array(next)?,
            fixed,
        })
    }

    /// Forwards one token, evaluates its logits `[1, 1, vocab]` and the
    /// caches, then trims the caches back (see [`DecodeStep`]).
    pub fn run(&mut self) -> Result<Array, BenchError> {
        let logits = match &self.fixed {
            Some(fixed) => fixed.forward(&self.token, &mut self.caches)?,
            None => self.model.forward(&self.token, &mut self.caches)?,
        };
        eval_with_caches(&logits, &self.caches)?;
        for cache in &mut self.caches {
            cache.trim(1);
        }
        Ok(logits)
    }

    /// The caches.
    pub fn caches(&self) -> &[LayerCache] {
        &self.caches
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gemma::config::Gemma3Config;
    use gemma::load::{load, LoadOptions, ModelSource, WeightStorage};
    use mlx_core::Dtype;

    /// Six layers (five sliding with a window of 16, one global) of a small width.
    fn tiny_model() -> Gemma3 {
        let mut c = Gemma3Config::published("270m", Some(6)).unwrap();
        c.vocab_size = 256;
        c.hidden_size = 64;
        c.intermediate_size = 128;
        c.head_dim = 32;
        c.query_pre_attn_scalar = 32.0;
        c.sliding_window = 16;
        let source = ModelSource::Random {
            config: Box::new(c),
            seed: 7,
        };
        let options = LoadOptions {
            dtype: Dtype::Float32,
            quantize: None,
            weights: WeightStorage::Dequantized,
        };
        load(&source, options, &mut |_, _| {}).unwrap().model
    }

    /// The largest |a − b| of two equally long rows of logits.
    fn max_gap(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    }

    fn offsets(step: &DecodeStep<'_>) -> Vec<i32> {
        step.caches().iter().map(LayerCache::offset).collect()
    }

    #[test]
    fn before_the_window_wraps_every_step_is_the_same_step() {
        let model = tiny_model();
        let mut step = DecodeStep::new(&model, CacheFormat::COMPUTE, 10, 1, false).unwrap();
        assert_eq!(offsets(&step), vec![10; 6]);
        let first = step.run().unwrap().to_vec::<f32>().unwrap();
        step.run().unwrap();
        let third = step.run().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(offsets(&step), vec![10; 6]);
        assert_eq!(first, third);

        // The compiled step repeats the same step too, with the same logits.
        let mut compiled = DecodeStep::new(&model, CacheFormat::COMPUTE, 10, 1, true).unwrap();
        compiled.run().unwrap();
        let again = compiled.run().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(offsets(&compiled), vec![10; 6]);
        let gap = max_gap(&again, &first);
        assert!(gap < 1e-4, "compiled step differs by {gap}");

        // The same token after the same 10 in one forward, without caches reused.
        let tokens = random_tokens(11, 256, 1).unwrap();
        let mut caches = model.make_caches(CacheFormat::COMPUTE).unwrap();
        let full = prompt_logits(&model, &mut caches, &tokens).unwrap();
        let full = full.to_vec::<f32>().unwrap();
        assert_eq!(full.len(), 256);
        let worst = max_gap(&full, &first);
        assert!(
            worst < 1e-4,
            "decode step differs from a full forward by {worst}"
        );
    }

    #[test]
    fn after_the_window_wraps_global_layers_stay_at_the_context_length() {
        let model = tiny_model();
        let mut step = DecodeStep::new(&model, CacheFormat::COMPUTE, 40, 2, false).unwrap();
        let bytes: Vec<usize> = step.caches().iter().map(LayerCache::nbytes).collect();
        for _ in 0..3 {
            step.run().unwrap();
        }
        // Sliding layers 0..5 keep each token (steady state), global layer 5 trims.
        assert_eq!(offsets(&step), vec![43, 43, 43, 43, 43, 40]);
        let after: Vec<usize> = step.caches().iter().map(LayerCache::nbytes).collect();
        assert_eq!(&after[..5], &bytes[..5]);
    }

    #[test]
    fn after_the_window_wraps_the_compiled_step_repeats_the_eager_step() {
        // The sliding caches run ahead of the trimmed global one: each kind
        // keeps its own position, as in the eager pass.
        let model = tiny_model();
        let mut eager = DecodeStep::new(&model, CacheFormat::COMPUTE, 40, 2, false).unwrap();
        let mut compiled = DecodeStep::new(&model, CacheFormat::COMPUTE, 40, 2, true).unwrap();
        for _ in 0..3 {
            let a = eager.run().unwrap().to_vec::<f32>().unwrap();
            let b = compiled.run().unwrap().to_vec::<f32>().unwrap();
            let gap = max_gap(&a, &b);
            assert!(gap < 1e-4, "compiled step differs by {gap}");
        }
        assert_eq!(offsets(&compiled), vec![43, 43, 43, 43, 43, 40]);
    }
}
