//! `SamplerConfig`: every sampling setting, with its defaults and validation.

use crate::check;
use crate::SampleError;

/// The settings of one [`crate::Sampler`]. `None` turns a filter or penalty off.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `0` picks the most likely token (greedy). Finite and `>= 0`.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens. `>= 1`; a `k` of at least the
    /// vocabulary size keeps every token.
    pub top_k: Option<usize>,
    /// Nucleus sampling: keep the most likely tokens whose probabilities add
    /// up to `top_p`. In `(0, 1]`; `1` keeps every token.
    pub top_p: Option<f32>,
    /// Keep tokens whose probability is at least `min_p` times the top
    /// token's. In `[0, 1]`; `0` keeps every token.
    pub min_p: Option<f32>,
    /// The number of most likely tokens the min-p filter never removes. `>= 1`.
    pub min_tokens_to_keep: usize,
    /// Sign-aware multiplicative penalty for tokens in the recent window:
    /// positive logits are divided by it, negative ones multiplied. Finite and `> 0`.
    pub repetition_penalty: Option<f32>,
    /// Subtracted once from the logit of every token present in the recent
    /// window. Finite (negative values favour repetition).
    pub presence_penalty: Option<f32>,
    /// Subtracted from a token's logit once per occurrence in the recent
    /// window. Finite (negative values favour repetition).
    pub frequency_penalty: Option<f32>,
    /// How many of the most recent history tokens the repetition penalty
    /// looks at (mlx-lm's `repetition_context_size`). `>= 1`.
    pub repetition_window: usize,
    /// The same for the presence penalty (`presence_context_size`). `>= 1`.
    pub presence_window: usize,
    /// The same for the frequency penalty (`frequency_context_size`). `>= 1`.
    pub frequency_window: usize,
    /// `(token id, bias)` pairs added to the logits; biases of a repeated id
    /// add up. A bias may be `-inf` (bans the token) but not NaN or `+inf`.
    pub logit_bias: Vec<(u32, f32)>,
    /// XTC ("exclude top choices"): the probability, per drawn token, of
    /// removing every token more likely than `xtc_threshold` except the
    /// least likely of them. In `[0, 1]`; `None` or `0` turns it off.
    pub xtc_probability: Option<f32>,
    /// XTC's probability threshold. In `[0, 0.5]` (mlx-lm's default 0.1).
    pub xtc_threshold: f32,
    /// Token ids XTC never removes (mlx-lm's `xtc_special_tokens`; its
    /// command line passes the newline and end-of-sequence ids).
    pub xtc_special_tokens: Vec<u32>,
    /// Seed of the sampler's random key.
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// Greedy decoding with no filters, penalties or biases.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            min_tokens_to_keep: 1,
            repetition_penalty: None,
            presence_penalty: None,
            frequency_penalty: None,
            repetition_window: 20,
            presence_window: 20,
            frequency_window: 20,
            logit_bias: Vec::new(),
            xtc_probability: None,
            xtc_threshold: 0.1,
            xtc_special_tokens: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// How many recent history tokens any enabled penalty looks at (0 with
    /// no penalty): what a generation loop must keep.
    pub fn history_window(&self) -> usize {
        [
            (self.repetition_penalty, self.repetition_window),
            (self.presence_penalty, self.presence_window),
            (self.frequency_penalty, self.frequency_window),
        ]
        .iter()
        .filter(|(penalty, _)| penalty.is_some())
        .map(|&(_, window)| window)
        .max()
        .unwrap_or(0)
    }

    /// Checks every setting against its accepted range.
    pub fn validate(&self) -> Result<(), SampleError> {
        check::temperature(self.temperature)?;
        if let Some(k) = self.top_k {
            check::top_k(k)?;
        }
        if let Some(p) = self.top_p {
            check::top_p(p)?;
        }
        if let Some(p) = self.min_p {
            check::probability("min_p", p)?;
        }
        check::count("min_tokens_to_keep", self.min_tokens_to_keep)?;
        if let Some(p) = self.repetition_penalty {
            check::repetition_penalty(p)?;
        }
        if let Some(p) = self.presence_penalty {
            check::additive_penalty("presence_penalty", p)?;
        }
        if let Some(p) = self.frequency_penalty {
            check::additive_penalty("frequency_penalty", p)?;
        }
        check::count("repetition_window", self.repetition_window)?;
        check::count("presence_window", self.presence_window)?;
        check::count("frequency_window", self.frequency_window)?;
        if let Some(p) = self.xtc_probability {
            check::probability("xtc_probability", p)?;
        }
        check::xtc_threshold(self.xtc_threshold)?;
        check::logit_bias(&self.logit_bias)
    }
}
