//! `Sampler`: the logits processors, the filters and the draw, in mlx-lm's order.

use mlx_core::random;
use mlx_core::{Array, Dtype};

use crate::filters::{apply_min_p, apply_top_k, apply_top_p, apply_xtc};
use crate::processors::{
    apply_frequency_penalty, apply_presence_penalty, apply_repetition_penalty, last_tokens,
    LogitBias,
};
use crate::{check, SampleError, SamplerConfig};

/// Picks one token per call from a row of logits, on the device.
#[derive(Debug)]
pub struct Sampler {
    /// The validated settings.
    config: SamplerConfig,
    /// The logit bias, built once from `config.logit_bias`.
    bias: Option<LogitBias>,
    /// The random key; split on every sampled (non-greedy) draw.
    key: Array,
}

impl Sampler {
    /// A sampler for `config`, after [`SamplerConfig::validate`].
    pub fn new(config: SamplerConfig) -> Result<Sampler, SampleError> {
        config.validate()?;
        let bias = LogitBias::new(&config.logit_bias)?;
        let key = random::key(config.seed)?;
        Ok(Sampler { config, bias, key })
    }

    /// Whether this sampler always picks the most likely token (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.config.temperature == 0.0
    }

    /// Whether the pick is the argmax of the logits plus the logit bias
    /// alone: greedy, with no penalty (which would read the history).
    pub fn picks_biased_argmax(&self) -> bool {
        self.is_greedy() && self.config.history_window() == 0
    }

    /// The distinct (token id, summed bias) pairs of the logit bias,
    /// ascending by id (empty without a bias).
    pub fn logit_bias_pairs(&self) -> &[(u32, f32)] {
        self.bias.as_ref().map_or(&[], LogitBias::pairs)
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Chooses the next token. `logits`: `[1, vocab]` of any float dtype.
    /// `history`: the ids generated or seen so far, a 1-d int32 or uint32
    /// array with every id below `vocab` (each penalty uses the last entries
    /// of its window), or `None`. Returns the id as a uint32 array of
    /// shape `[1]`, not evaluated: nothing is read back to the host.
    pub fn sample(
        &mut self,
        logits: &Array,
        history: Option<&Array>,
    ) -> Result<Array, SampleError> {
        let logits = self.process_logits(logits, history)?;
        let token = if self.is_greedy() {
            logits.argmax(-1, false)?
        } else {
            let (next_key, mut draw_key) = random::split(&self.key)?;
            self.key = next_key;
            let mut filtered = self.filter(logits)?;
            if let Some(p) = self.config.xtc_probability.filter(|&p| p > 0.0) {
                let (key, xtc_key) = random::split(&draw_key)?;
                draw_key = key;
                filtered = self.xtc(&filtered, p, &xtc_key)?;
            }
            if let Some(k) = self.config.top_k {
                filtered = apply_top_k(&filtered, k)?;
            }
            let scaled = filtered.multiply(&Array::scalar(
                1.0 / f64::from(self.config.temperature),
                Dtype::Float32,
            )?)?;
            random::categorical(&scaled, -1, Some(&draw_key))?
        };
        Ok(token.astype(Dtype::Uint32)?)
    }

    /// The logits after the processors (logit bias, then the repetition,
    /// presence and frequency penalties), as float32 `[1, vocab]`: what
    /// [`Sampler::sample`] filters and draws from. Same inputs as `sample`.
    pub fn process_logits(
        &self,
        logits: &Array,
        history: Option<&Array>,
    ) -> Result<Array, SampleError> {
        check::logits_row(logits)?;
        let mut logits = logits.astype(Dtype::Float32)?;
        if let Some(bias) = &self.bias {
            logits = bias.apply(&logits)?;
        }
        let c = &self.config;
        let Some(history) = history.filter(|_| c.history_window() > 0) else {
            return Ok(logits);
        };
        let shape = history.shape();
        let dtype = history.dtype();
        let &[n] = shape.as_slice() else {
            return Err(SampleError::BadHistory { shape, dtype });
        };
        if !matches!(dtype, Dtype::Int32 | Dtype::Uint32) {
            return Err(SampleError::BadHistory { shape, dtype });
        }
        if n == 0 {
            return Ok(logits);
        }
        let recent = |window: usize| last_tokens(history, window);
        if let Some(penalty) = c.repetition_penalty {
            logits = apply_repetition_penalty(&logits, &recent(c.repetition_window)?, penalty)?;
        }
        if let Some(penalty) = c.presence_penalty {
            logits = apply_presence_penalty(&logits, &recent(c.presence_window)?, penalty)?;
        }
        if let Some(penalty) = c.frequency_penalty {
            logits = apply_frequency_penalty(&logits, &recent(c.frequency_window)?, penalty)?;
        }
        Ok(logits)
    }

    /// XTC with probability `p`: drawn on the device from `key`, so nothing
    /// is read back (as mlx-lm, which keeps the logits when a uniform draw
    /// exceeds `p`).
    fn xtc(&self, logits: &Array, p: f32, key: &Array) -> Result<Array, SampleError> {
        let c = &self.config;
        let excluded = apply_xtc(logits, c.xtc_threshold, &c.xtc_special_tokens)?;
        let draw = random::uniform(0.0, 1.0, &[], Dtype::Float32, Some(key))?;
        let apply = draw.less_equal(&Array::scalar(f64::from(p), Dtype::Float32)?)?;
        Ok(mlx_core::where_(&apply, &excluded, logits)?)
    }

    /// The first filters mlx-lm's `make_sampler` chains, in its order:
    /// top-p, min-p (then XTC and top-k, in [`Sampler::sample`]). Settings
    /// that keep every token are skipped, as there.
    /// The log-softmax is computed only for top-p, the one step that needs
    /// probabilities: min-p, top-k and the draw give the same result for
    /// logits shifted by a constant.
    fn filter(&self, mut logits: Array) -> Result<Array, SampleError> {
        let c = &self.config;
        if let Some(p) = c.top_p.filter(|&p| p < 1.0) {
            let logprobs = logits.subtract(&logits.logsumexp(&[-1], true)?)?;
            logits = apply_top_p(&logprobs, p)?;
        }
        if let Some(p) = c.min_p.filter(|&p| p > 0.0) {
            logits = apply_min_p(&logits, p, c.min_tokens_to_keep)?;
        }
        Ok(logits)
    }
}
