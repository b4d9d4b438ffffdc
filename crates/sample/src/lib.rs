//! Token samplers and logits processors computed with MLX ops on the device.
//!
//! [`Sampler::sample`] turns a row of logits into a token id without reading
//! anything back to the host, so a generation loop can queue step `n + 1`
//! before it reads step `n`. It follows mlx-lm 0.32.2 (`sample_utils.py`
//! and `generate_step`) step by step.
//!
//! # Order of application
//!
//! 1. The logits (`[1, vocab]`, any float dtype) are cast to float32.
//! 2. Logits processors, in mlx-lm's `make_logits_processors` order, each
//!    penalty over the last ids of the history in its own window
//!    (`repetition_window`, `presence_window`, `frequency_window`):
//!    1. logit bias: `logits[t] += bias[t]`;
//!    2. repetition penalty `r`: for each distinct recent token,
//!       `logits[t] / r` if `logits[t] >= 0`, else `logits[t] * r`;
//!    3. presence penalty `p`: `logits[t] -= p` once for each distinct recent token;
//!    4. frequency penalty `f`: `logits[t] -= f * count(t)`, `count(t)` being
//!       the occurrences of `t` in the window.
//! 3. Log-softmax: `logprobs = logits - logsumexp(logits)`.
//! 4. Temperature 0 (greedy): the token is `argmax(logprobs)`; the filters
//!    and the random key are not used (the filters never remove the top
//!    token, so they could not change the result).
//! 5. Otherwise the filters, in mlx-lm's `make_sampler` order, each setting
//!    removed tokens to `-inf` and judging the untempered distribution left
//!    by the filters before it: top-p (skipped when `top_p == 1`), min-p
//!    (with `min_tokens_to_keep`; skipped when `min_p == 0`), XTC (with
//!    probability `xtc_probability`, drawn on the device: every token more
//!    likely than `xtc_threshold` but the least likely of them is removed,
//!    `xtc_special_tokens` never), top-k.
//! 6. Temperature and draw: `categorical(logprobs / temperature)` with a
//!    fresh subkey split off the sampler's key, which comes from `seed`.
//!    The same seed, settings and inputs give the same tokens.
//!
//! Steps 4 to 6 give the same result for logits shifted by a constant,
//! except top-p, which needs probabilities; so step 3 is carried out only
//! when top-p is on (it costs as much as the draw itself on a CPU), and
//! greedy decoding takes the argmax of the processed logits.
//!
//! # Differences from mlx-lm
//!
//! The formulas above are mlx-lm's. Ours differs only in these ways:
//!
//! - Precision: everything runs in float32. mlx-lm keeps the model's dtype
//!   (often bfloat16) and only moves top-p's probabilities to float32, so
//!   results can differ in the last bits (and, rarely, in a drawn token).
//!   Skipping the log-softmax (see above) changes rounding only: argmax,
//!   min-p, top-k and the Gumbel-max draw are exactly shift-invariant in
//!   real arithmetic. Greedy decoding can differ from mlx-lm's only where
//!   subtracting the logsumexp rounds two distinct logits to the same value
//!   (mlx-lm then picks the lower id; we pick the larger logit).
//! - Randomness: mlx-lm draws from MLX's global random state
//!   (`mx.random.seed`); we split an explicit key per draw. The
//!   distribution is the same, the concrete token streams for a given seed are not.
//! - Turning things off: `None` turns a filter or penalty off. mlx-lm's
//!   "off" values `top_k = 0` and `repetition_penalty = 0` are rejected by
//!   [`SamplerConfig::validate`], as are penalty windows of 0 (in mlx-lm,
//!   `tokens[-0:]` is the whole history). `top_p = 1`, `min_p = 0` and
//!   presence or frequency penalties of 0 are no-ops, as in mlx-lm.
//! - Range checks: a `top_k` or `min_tokens_to_keep` of at least the vocabulary
//!   size keeps every token (mlx-lm raises an error, for `top_k`, or fails in
//!   `argpartition`, for `min_tokens_to_keep` above the vocabulary size);
//!   presence and frequency penalties must be finite (mlx-lm does not check
//!   them); a logit-bias or XTC special id outside the vocabulary is an
//!   error.
//! - Logit bias: a list of pairs in which biases of a repeated id add up
//!   (mlx-lm takes a dict, so ids cannot repeat).
//! - XTC's draw (whether to apply it) comes from the sampler's key, like the
//!   token's draw.

mod check;
mod config;
mod error;
pub mod filters;
pub mod processors;
mod sampler;

pub use config::SamplerConfig;
pub use error::SampleError;
pub use sampler::Sampler;
