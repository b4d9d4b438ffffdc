//! The generation loop: chunked prefill, then pipelined decoding — the next
//! steps are queued on the device before the current token is read back, as
//! mlx-lm does with `async_eval`, but up to [`GenerateOptions::steps_per_sync`]
//! at a time — with streaming detokenization, stop conditions, cancellation and a
//! check for non-finite logits at every step.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Instant;

use gemma::cache::LayerCache;
use gemma::decode_step::DecodeStep;
use gemma::kernels::GreedyPick;
use gemma::model::Gemma3;
use gemma::tokenizer::{StreamingDecoder, Tokenizer};
use mlx_core::{async_eval, concatenate, memory, Array, Dtype};
use sample::processors::last_tokens;
use sample::Sampler;

use crate::error::GenerateError;
use crate::metrics::{DecodeHostTimes, Metrics};
use crate::options::{DecodeMode, FinishReason, GenerateOptions};

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

/// The logits of the last position of `[1, L, V]` logits, as `[1, V]`.
fn last_position(logits: &Array) -> Result<Array, GenerateError> {
    let shape = logits.shape();
    let (l, v) = (shape[1], shape[2]);
    Ok(logits
        .slice(&[0, l - 1, 0], &[1, l, v], &[1, 1, 1])?
        .reshape(&[1, v])?)
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
    let stop_ids: Vec<u32> = match tokenizer {
        Some(t) => t.stop_ids().to_vec(),
        None => model.config.eos_token_ids.clone(),
    };
    let mut sampler = Sampler::new(options.sampler.clone())?;
    let window = options.sampler.history_window();
    let penalties = window > 0;
    memory::reset_peak()?;

    // Prefill all but the last prompt token in chunks; only the caches are evaluated.
    let (head, last) = prompt.split_at(prompt.len() - 1);
    for chunk in prefill_chunks(head, cached, options.prefill_chunk, options.kv_start) {
        model.hidden(&token_array(chunk)?, caches)?;
        let arrays: Vec<&Array> = caches.iter().flat_map(LayerCache::arrays).collect();
        mlx_core::eval(&arrays)?;
    }

    // Every token from the last prompt token on is a single-token step:
    // reserve the cache for the whole generation and step compiled (unless
    // its format changes before the end).
    let fixed = match options.decode {
        DecodeMode::Compiled => {
            let step = DecodeStep::new(model, true)?;
            let positions = (cached + prompt.len() + options.max_tokens).min(context);
            step.reserve(caches, positions as i32)?.then_some(step)
        }
        DecodeMode::Eager => None,
    };

    let mut history = if penalties {
        Some(last_tokens(&token_array(prompt)?.reshape(&[-1])?, window)?)
    } else {
        None
    };
    // With our GPU kernels and a plain greedy pick, one kernel takes each
    // step's argmax and finiteness check.
    let greedy = if sampler.picks_biased_argmax() && model.runs_gpu_kernels()? {
        GreedyPick::new(model.config.vocab_size as i32, sampler.logit_bias_pairs())?
    } else {
        None
    };
    // One decode step: its token id and finiteness flag as one uint32 `[2]`.
    let step = |input: &Array,
                caches: &mut [LayerCache],
                sampler: &mut Sampler,
                history: Option<&Array>|
     -> Result<Array, GenerateError> {
        let logits = match &fixed {
            Some(fixed) => fixed.forward(input, caches)?,
            None => model.forward(input, caches)?,
        };
        let logits = last_position(&logits)?;
        let picked = greedy.as_ref().map(|g| g.pick(&logits)).transpose()?;
        if let Some(picked) = picked.flatten() {
            return Ok(picked);
        }
        let logits = logits.astype(Dtype::Float32)?;
        let finite = logits.isfinite()?.all_all()?;
        let token = sampler.sample(&logits, history)?;
        step_pair(&token, &finite)
    };

    let mut host = DecodeHostTimes::default();
    let mut clock = Instant::now();
    let mut lap = |into: &mut f64| {
        let now = Instant::now();
        *into += (now - clock).as_secs_f64();
        clock = now;
    };
    // Batches of steps queued on the device and not yet read back, oldest
    // first, each packed into one array, and the token ids and finiteness
    // flags read back and not yet handed on; `in_flight` counts the steps of
    // both. The first step runs alone, and the batches after it grow from
    // one step (`batch_size`).
    let mut batches: VecDeque<Array> = VecDeque::new();
    let mut read: VecDeque<(u32, bool)> = VecDeque::new();
    let first = step(&token_array(last)?, caches, &mut sampler, history.as_ref())?;
    let mut last_token = step_token(&first)?;
    lap(&mut host.build_s);
    async_eval(&[&first])?;
    lap(&mut host.queue_s);
    batches.push_back(first);
    let mut in_flight = 1;
    // Steps queued so far: each yields one token.
    let mut steps = 1;
    let batch = options.steps_per_sync;
    // Batches queued after the first step, which set the next one's size.
    let mut batches_queued = 0;

    let mut decoder = tokenizer.map(StreamingDecoder::new);
    let mut text = String::new();
    // Bytes of `text` handed to `on_token`; the rest may begin a stop string.
    let mut emitted = 0;
    let mut ids: Vec<u32> = Vec::new();
    let mut first_token_at = None;
    let mut finish = FinishReason::Length;
    let max_tokens = options.max_tokens;
    while ids.len() < max_tokens {
        if options.cancel.load(Ordering::Relaxed) {
            finish = FinishReason::Cancelled;
            break;
        }
        // Queue the next batch of steps, as one evaluation, while the device
        // still has a batch to run. Step s feeds token s − 1 at position
        // `cached + prompt.len() + s − 1`, which must lie inside the context.
        if in_flight <= batch {
            let size = batch_size(batches_queued, batch);
            let mut queued: Vec<Array> = Vec::with_capacity(size);
            while queued.len() < size
                && steps < max_tokens
                && cached + prompt.len() + steps - 1 < context
            {
                if let Some(h) = history.as_mut() {
                    *h = last_tokens(
                        &concatenate(&[h, &last_token.astype(h.dtype())?], 0)?,
                        window,
                    )?;
                }
                let next = step(
                    &last_token.reshape(&[1, 1])?,
                    caches,
                    &mut sampler,
                    history.as_ref(),
                )?;
                last_token = step_token(&next)?;
                queued.push(next);
                steps += 1;
            }
            lap(&mut host.build_s);
            if !queued.is_empty() {
                batches_queued += 1;
                let packed = pack_steps(&queued)?;
                async_eval(&[&packed])?;
                batches.push_back(packed);
                in_flight += queued.len();
            }
            lap(&mut host.queue_s);
        }
        if read.is_empty() {
            let Some(packed) = batches.pop_front() else {
                break;
            };
            read.extend(unpack_steps(&packed.to_vec::<u32>()?));
        }
        let Some((id, is_finite)) = read.pop_front() else {
            break;
        };
        in_flight -= 1;
        lap(&mut host.wait_s);
        if !is_finite {
            return Err(GenerateError::NonFinite { step: ids.len() });
        }
        if first_token_at.is_none() {
            host = DecodeHostTimes {
                first_token_s: host.build_s + host.queue_s + host.wait_s,
                ..DecodeHostTimes::default()
            };
            first_token_at = Some(Instant::now());
        }
        let index = ids.len();
        ids.push(id);
        if stop_ids.contains(&id) {
            on_token(&TokenEvent {
                index,
                id,
                text: "",
            });
            finish = FinishReason::Stop;
            break;
        }
        let piece = match decoder.as_mut() {
            Some(decoder) => decoder.push(id)?,
            None => String::new(),
        };
        text.push_str(&piece);
        if let Some(cut) = stop_string_end(&text, &options.stop_strings) {
            text.truncate(cut);
            on_token(&TokenEvent {
                index,
                id,
                text: text.get(emitted..).unwrap_or(""),
            });
            finish = FinishReason::StopString;
            break;
        }
        let safe = text.len() - held_back(&text, &options.stop_strings);
        on_token(&TokenEvent {
            index,
            id,
            text: text.get(emitted..safe).unwrap_or(""),
        });
        emitted = emitted.max(safe);
        if in_flight == 0 {
            break;
        }
    }
    if finish != FinishReason::StopString {
        if let Some(decoder) = decoder.as_mut() {
            text.push_str(&decoder.finish());
            let rest = text.get(emitted..).unwrap_or("");
            if let (false, Some(&id)) = (rest.is_empty(), ids.last()) {
                on_token(&TokenEvent {
                    index: ids.len() - 1,
                    id,
                    text: rest,
                });
            }
        }
    }
    let end = Instant::now();
    let first = first_token_at.unwrap_or(end);
    let prefill_s = (first - start).as_secs_f64();
    let decode_s = (end - first).as_secs_f64();
    let metrics = Metrics {
        prompt_tokens: prompt.len(),
        prompt_tps: if prefill_s > 0.0 {
            prompt.len() as f64 / prefill_s
        } else {
            0.0
        },
        generation_tokens: ids.len(),
        generation_tps: if decode_s > 0.0 && ids.len() > 1 {
            (ids.len() - 1) as f64 / decode_s
        } else {
            0.0
        },
        ttft_s: prefill_s,
        peak_memory_bytes: memory::peak_bytes()?,
        decode_host: host,
    };
    Ok(Generation {
        text,
        token_ids: ids,
        finish_reason: finish,
        decode: if fixed.is_some() {
            DecodeMode::Compiled
        } else {
            DecodeMode::Eager
        },
        metrics,
    })
}

/// Steps of the batch queued after `queued` others (after the first step):
/// 1, 2, 4, … up to `steps_per_sync`. So only one step is queued ahead when
/// the first token is read (as mlx-lm queues one): the first token is not
/// held back while a whole batch is built, the device starts early, and no
/// more than one step's work can run before the generation's clock starts.
fn batch_size(queued: usize, steps_per_sync: usize) -> usize {
    (1usize << queued.min(usize::BITS as usize - 1)).min(steps_per_sync)
}

/// The token id of a decode step's `[id, finite]` (uint32 `[2]`), as `[1]`:
/// the next step's input.
fn step_token(step: &Array) -> Result<Array, GenerateError> {
    Ok(step.slice(&[0], &[1], &[1])?)
}

/// A decode step's token id and finiteness flag (any integer and boolean
/// arrays of one value) as one uint32 `[id, finite]`.
fn step_pair(token: &Array, finite: &Array) -> Result<Array, GenerateError> {
    Ok(concatenate(
        &[
            &token.astype(Dtype::Uint32)?.reshape(&[1])?,
            &finite.astype(Dtype::Uint32)?.reshape(&[1])?,
        ],
        0,
    )?)
}

/// The `[id, finite]` pairs of a batch of decode steps as one array, so
/// that the evaluation of the batch has a single output: MLX's CUDA backend
/// signals the end of every output of an evaluation with its own kernel
/// (Nsight Compute found one per output on the H200, at 60–250 µs each).
fn pack_steps(steps: &[Array]) -> Result<Array, GenerateError> {
    match steps {
        [one] => Ok(one.clone()),
        _ => Ok(concatenate(&steps.iter().collect::<Vec<_>>(), 0)?),
    }
}

/// The (token id, logits finite) pairs of a batch of steps, read back.
fn unpack_steps(values: &[u32]) -> impl Iterator<Item = (u32, bool)> + '_ {
    values.chunks_exact(2).map(|pair| (pair[0], pair[1] != 0))
}

/// `tokens` (which follow `cached` tokens) cut into chunks of at most
/// `size`, with a cut where the cache reaches `kv_start` tokens so that the
/// tokens from there on are quantized as they enter.
fn prefill_chunks(tokens: &[u32], cached: usize, size: usize, kv_start: usize) -> Vec<&[u32]> {
    let split = kv_start.saturating_sub(cached).min(tokens.len());
    let (before, after) = tokens.split_at(split);
    before.chunks(size).chain(after.chunks(size)).collect()
}

/// The length of the longest end of `text` that could begin one of `stops`
/// (a proper prefix of a stop string): text not to stream yet.
fn held_back(text: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .filter_map(|s| {
            (1..s.len())
                .rev()
                .find(|&k| s.is_char_boundary(k) && text.ends_with(&s[..k]))
        })
        .max()
        .unwrap_or(0)
}

/// Where `text` must be cut if it contains one of `stops` (the earliest one).
fn stop_string_end(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}

#[cfg(test)]
mod tests {
    use mlx_core::{Array, Dtype};

    use super::{
        batch_size, held_back, pack_steps, prefill_chunks, step_pair, step_token, stop_string_end,
        unpack_steps,
    };

    #[test]
    fn batches_grow_from_one_step_to_the_steps_per_sync() {
        let sizes = |limit| (0..6).map(|k| batch_size(k, limit)).collect::<Vec<_>>();
        assert_eq!(sizes(8), [1, 2, 4, 8, 8, 8]);
        assert_eq!(sizes(3), [1, 2, 3, 3, 3, 3]);
        assert_eq!(sizes(1), [1; 6]);
        assert_eq!(batch_size(200, 64), 64);
    }

    #[test]
    fn packed_steps_read_back_as_their_tokens_and_flags() {
        let step = |id: u32, finite: bool| {
            let token = Array::from_slice(&[id], &[1]).unwrap();
            let flag = Array::scalar(f64::from(u8::from(finite)), Dtype::Bool).unwrap();
            let pair = step_pair(&token, &flag).unwrap();
            assert_eq!(step_token(&pair).unwrap().to_vec::<u32>().unwrap(), [id]);
            pair
        };
        let steps = [step(5, true), step(262_143, false), step(0, true)];
        let alone = pack_steps(&steps[..1]).unwrap();
        assert_eq!(alone.to_vec::<u32>().unwrap(), [5, 1]);
        let packed = pack_steps(&steps).unwrap();
        assert_eq!(packed.shape(), vec![6]);
        let values = packed.to_vec::<u32>().unwrap();
        assert_eq!(
            unpack_steps(&values).collect::<Vec<_>>(),
            vec![(5, true), (262_143, false), (0, true)]
        );
    }

    #[test]
    fn prefill_chunks_are_cut_where_quantization_starts() {
        let t: Vec<u32> = (0..10).collect();
        let lens = |c: Vec<&[u32]>| c.iter().map(|c| c.len()).collect::<Vec<_>>();
        assert_eq!(lens(prefill_chunks(&t, 0, 4, 0)), vec![4, 4, 2]);
        assert_eq!(lens(prefill_chunks(&t, 0, 4, 6)), vec![4, 2, 4]);
        assert_eq!(lens(prefill_chunks(&t, 3, 4, 6)), vec![3, 4, 3]);
        assert_eq!(lens(prefill_chunks(&t, 8, 4, 6)), vec![4, 4, 2]);
    }

    #[test]
    fn stop_strings_cut_at_the_earliest_match() {
        let stops = vec!["\n\n".to_string(), "END".to_string()];
        assert_eq!(stop_string_end("abc END x\n\n", &stops), Some(4));
        assert_eq!(stop_string_end("abc", &stops), None);
        assert_eq!(stop_string_end("abc", &[String::new()]), None);
    }

    #[test]
    fn text_that_may_begin_a_stop_string_is_held_back() {
        let stops = vec!["France. It".to_string(), "ß!".to_string()];
        assert_eq!(held_back("of France", &stops), 6);
        assert_eq!(held_back("of France.", &stops), 7);
        assert_eq!(held_back("of France!", &stops), 0);
        assert_eq!(held_back("Straße", &stops), 0);
        assert_eq!(held_back("Straß", &stops), 2);
        assert_eq!(held_back("x", &[]), 0);
    }
}
