//! The generation loop: chunked prefill, then pipelined decoding — the next
//! steps are queued on the device before the current token is read back, as
//! mlx-lm does with `async_eval`, but up to [`GenerateOptions::steps_per_sync`]
//! at a time — with streaming detokenization, stop conditions, cancellation and a
//! check for non-finite logits at every step.

mod output;
mod prefill;
mod schedule;
mod step;
mod timing;

use std::sync::atomic::Ordering;
use std::time::Instant;

use gemma::cache::LayerCache;
use gemma::model::Gemma3;
use gemma::tokenizer::Tokenizer;
use mlx_core::{memory, Array};
use sample::Sampler;

use crate::error::GenerateError;
use crate::metrics::Metrics;
use crate::options::{DecodeMode, FinishReason, GenerateOptions};
use output::Output;
use prefill::prefill;
use schedule::Schedule;
use step::Stepper;
use timing::{HostClock, Phase};

/// The result of one generation.
#[derive(Debug, Clone)]
pub struct Generation {
    /// The generated text (stop string and stop token excluded).
    pub text: String,
    /// The generated token ids (a final stop token included).
    pub token_ids: Vec<u32>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// How the tokens after the prompt were decoded: compiled only when asked
    /// for and the cache could be reserved (a cache that keeps floats for
    /// `kv_start` tokens and switches format while generating decodes
    /// eagerly).
    pub decode: DecodeMode,
    /// Speed and memory.
    pub metrics: Metrics,
}

/// One generated token, as the loop hands it to the caller.
#[derive(Debug, Clone, Copy)]
pub struct TokenEvent<'a> {
    /// 0-based index among the generated tokens.
    pub index: usize,
    /// The token id.
    pub id: u32,
    /// Text completed by this token (may be empty: part of a UTF-8 character,
    /// text that may begin a stop string — handed on with a later token, or
    /// never if the stop string completes —, a stop token, or a model without
    /// tokenizer).
    pub text: &'a str,
}

/// Token ids `[1, n]` as an int32 array.
fn token_array(ids: &[u32]) -> Result<Array, GenerateError> {
    let ids: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
    Ok(Array::from_slice(&ids, &[1, ids.len() as i32])?)
}

/// Runs `prompt` (the tokens after what `caches` already hold) through the
/// model and generates until a stop condition. `on_token` sees every token
/// with the text it completes (never half a UTF-8 character). When the context
/// fills up (no position left to feed the last token at), the generation ends
/// with [`FinishReason::Length`].
pub fn generate(
    model: &Gemma3,
    tokenizer: Option<&Tokenizer>,
    prompt: &[u32],
    caches: &mut [LayerCache],
    options: &GenerateOptions,
    on_token: &mut dyn FnMut(&TokenEvent<'_>),
) -> Result<Generation, GenerateError> {
    let start = Instant::now();
    let cached = check_request(model, prompt, caches, options)?;
    let stop_ids = match tokenizer {
        Some(t) => t.stop_ids().to_vec(),
        None => model.config.eos_token_ids.clone(),
    };
    let sampler = Sampler::new(options.sampler.clone())?;
    memory::reset_peak()?;
    let (head, last) = prompt.split_at(prompt.len() - 1);
    prefill(model, head, cached, options, caches)?;

    let fed = cached + prompt.len();
    let mut stepper = Stepper::new(model, sampler, prompt, fed, caches, options)?;
    let mut clock = HostClock::start();
    let first = stepper.first(last, caches)?;
    // Step s feeds token s − 1 at position `fed + s − 1`, inside the context.
    let max_steps = options
        .max_tokens
        .min(model.config.max_position_embeddings + 1 - fed);
    let mut schedule = Schedule::start(first, options.steps_per_sync, max_steps, &mut clock)?;
    let mut output = Output::new(tokenizer, stop_ids, &options.stop_strings);
    let finish = decode(
        &mut stepper,
        &mut schedule,
        &mut clock,
        &mut output,
        caches,
        options,
        on_token,
    )?;
    let generated = output.generated();
    let (text, token_ids) = output.finish(finish, on_token);
    Ok(Generation {
        text,
        token_ids,
        finish_reason: finish,
        decode: stepper.mode(),
        metrics: clock.metrics(start, prompt.len(), generated)?,
    })
}

/// The tokens the caches hold, once the request is checked: a prompt of at
/// least one token inside the vocabulary and the context, a prefill chunk
/// and a batch of at least one.
fn check_request(
    model: &Gemma3,
    prompt: &[u32],
    caches: &[LayerCache],
    options: &GenerateOptions,
) -> Result<usize, GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::Input("the prompt has no tokens".into()));
    }
    let cached = caches.first().map_or(0, |c| c.offset()) as usize;
    let context = model.config.max_position_embeddings;
    if cached + prompt.len() > context {
        return Err(GenerateError::PromptTooLong {
            tokens: cached + prompt.len(),
            context,
        });
    }
    if options.prefill_chunk == 0 {
        return Err(GenerateError::Input(
            "the prefill chunk must be at least 1 token".into(),
        ));
    }
    if options.steps_per_sync == 0 {
        return Err(GenerateError::Input(
            "at least 1 decode step must be queued per synchronisation".into(),
        ));
    }
    let vocab = model.config.vocab_size as u32;
    if let Some(&bad) = prompt.iter().find(|&&id| id >= vocab) {
        return Err(GenerateError::Input(format!(
            "token id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    Ok(cached)
}

/// Decodes until a stop condition or cancellation: queues steps ahead,
/// reads each token back, checks its logits were finite, and hands it on.
fn decode(
    stepper: &mut Stepper<'_>,
    schedule: &mut Schedule,
    clock: &mut HostClock,
    output: &mut Output<'_, '_>,
    caches: &mut [LayerCache],
    options: &GenerateOptions,
    on_token: &mut dyn FnMut(&TokenEvent<'_>),
) -> Result<FinishReason, GenerateError> {
    while output.generated() < options.max_tokens {
        if options.cancel.load(Ordering::Relaxed) {
            return Ok(FinishReason::Cancelled);
        }
        schedule.queue(stepper, caches, clock)?;
        let Some((id, is_finite)) = schedule.read()? else {
            break;
        };
        clock.lap(Phase::Wait);
        if !is_finite {
            return Err(GenerateError::NonFinite {
                step: output.generated(),
            });
        }
        clock.token_read();
        if let Some(finish) = output.push(id, on_token)? {
            return Ok(finish);
        }
        if schedule.drained() {
            break;
        }
    }
    Ok(FinishReason::Length)
}
