//! Building one decode step: the forward pass of one token (compiled or
//! eager), then the pick of the next token and a finiteness check of the
//! logits, packed as one uint32 `[id, finite]` that stays on the device.

use gemma::cache::LayerCache;
use gemma::cuda::GreedyPick;
use gemma::forward::decode_step::DecodeStep;
use gemma::model::Gemma3;
use mlx_core::device::{default_device, Device};
use mlx_core::{concatenate, Array, Dtype};
use sample::processors::last_tokens;
use sample::Sampler;

use super::token_array;
use crate::error::GenerateError;
use crate::options::{DecodeMode, GenerateOptions};

/// Builds decode steps, keeping the recent tokens the sampler's penalties
/// read.
pub struct Stepper<'m> {
    /// The model.
    model: &'m Gemma3,
    /// The compiled fixed-shape step, when the caches could be reserved.
    fixed: Option<DecodeStep>,
    /// One kernel taking the argmax and the finiteness check, when the pick
    /// is a plain greedy one and the model runs our GPU kernels.
    greedy: Option<GreedyPick>,
    /// Chooses each token.
    sampler: Sampler,
    /// The last `window` token ids fed, for the penalties (`None` without).
    history: Option<Array>,
    /// Tokens the penalties look back at (0 without penalties).
    window: usize,
}

impl<'m> Stepper<'m> {
    /// Steps after `prompt`, which ends at `fed` tokens in the caches. Every
    /// token from the prompt's last on is a single-token step: with
    /// [`DecodeMode::Compiled`] the caches are reserved for the whole
    /// generation and the steps run compiled (unless the cache format
    /// changes before the end).
    pub fn new(
        model: &'m Gemma3,
        sampler: Sampler,
        prompt: &[u32],
        fed: usize,
        caches: &mut [LayerCache],
        options: &GenerateOptions,
    ) -> Result<Stepper<'m>, GenerateError> {
        let fixed = match options.decode {
            DecodeMode::Compiled => {
                let step = DecodeStep::new(model, true)?;
                let positions =
                    (fed + options.max_tokens).min(model.config.max_position_embeddings);
                step.reserve(caches, positions as i32)?.then_some(step)
            }
            DecodeMode::Eager => None,
        };
        let window = options.sampler.history_window();
        let history = if window > 0 {
            Some(last_tokens(&token_array(prompt)?.reshape(&[-1])?, window)?)
        } else {
            None
        };
        let on_cpu = default_device()? == Device::Cpu;
        let greedy = if sampler.picks_biased_argmax() && (on_cpu || model.runs_gpu_kernels()?) {
            GreedyPick::new(model.config.vocab_size as i32, sampler.logit_bias_pairs())?
        } else {
            None
        };
        Ok(Stepper {
            model,
            fixed,
            greedy,
            sampler,
            history,
            window,
        })
    }

    /// How the steps run.
    pub fn mode(&self) -> DecodeMode {
        match self.fixed {
            Some(_) => DecodeMode::Compiled,
            None => DecodeMode::Eager,
        }
    }

    /// The step feeding the prompt's last token `last` (already in the
    /// history).
    pub fn first(
        &mut self,
        last: &[u32],
        caches: &mut [LayerCache],
    ) -> Result<Array, GenerateError> {
        self.step(&token_array(last)?, caches)
    }

    /// The step feeding `token` (`[1]`, an earlier step's pick): it joins
    /// the history first.
    pub fn after(
        &mut self,
        token: &Array,
        caches: &mut [LayerCache],
    ) -> Result<Array, GenerateError> {
        if let Some(h) = self.history.as_mut() {
            *h = last_tokens(
                &concatenate(&[h, &token.astype(h.dtype())?], 0)?,
                self.window,
            )?;
        }
        self.step(&token.reshape(&[1, 1])?, caches)
    }

    /// One decode step of `input` (`[1, 1]`): its token id and finiteness
    /// flag as one uint32 `[2]`.
    fn step(&mut self, input: &Array, caches: &mut [LayerCache]) -> Result<Array, GenerateError> {
        let logits = match &self.fixed {
            Some(fixed) => fixed.forward(input, caches)?,
            None => self.model.forward(input, caches)?,
        };
        let logits = last_position(&logits)?;
        let picked = self.greedy.as_ref().map(|g| g.pick(&logits)).transpose()?;
        if let Some(picked) = picked.flatten() {
            return Ok(picked);
        }
        let logits = logits.astype(Dtype::Float32)?;
        let finite = logits.isfinite()?.all_all()?;
        let token = self.sampler.sample(&logits, self.history.as_ref())?;
        step_pair(&token, &finite)
    }
}

/// The logits of the last position of `[1, L, V]` logits, as `[1, V]`.
fn last_position(logits: &Array) -> Result<Array, GenerateError> {
    let shape = logits.shape();
    let (l, v) = (shape[1], shape[2]);
    Ok(logits
        .slice(&[0, l - 1, 0], &[1, l, v], &[1, 1, 1])?
        .reshape(&[1, v])?)
}

/// The token id of a decode step's `[id, finite]` (uint32 `[2]`), as `[1]`:
/// the next step's input.
pub fn step_token(step: &Array) -> Result<Array, GenerateError> {
    Ok(step.slice(&[0], &[1], &[1])?)
}

/// A decode step's token id and finiteness flag (any integer and boolean
/// arrays of one value) as one uint32 `[id, finite]`.
pub fn step_pair(token: &Array, finite: &Array) -> Result<Array, GenerateError> {
    Ok(concatenate(
        &[
            &token.astype(Dtype::Uint32)?.reshape(&[1])?,
            &finite.astype(Dtype::Uint32)?.reshape(&[1])?,
        ],
        0,
    )?)
}
