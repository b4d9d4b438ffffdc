//! A logits processor of our own in a decoding loop: a lipogram that bans
//! every token whose text contains the letter "e", applied to the logits
//! before `sample`'s sampler filters and draws.
//!
//! `engine::generate` takes its processors from `SamplerConfig` (biases
//! and penalties), so this example drives the model itself: prefill the
//! prompt, then per token process the last logits, sample, and feed the
//! token back through the KV cache.
//!
//! `cargo run --release --example custom_processor`

mod common;

use anyhow::{ensure, Result};
use engine::{Engine, GenerateOptions};
use gemma::tokenizer::Tokenizer;
use mlx_core::{Array, Dtype};
use sample::{Sampler, SamplerConfig};

/// Turns a row of logits `[1, vocab]` into the logits to sample from.
trait LogitsProcessor {
    /// The processed logits (float32 `[1, vocab]`), built on the device.
    fn process(&self, logits: &Array) -> Result<Array>;
}

/// Bans every token whose text contains one of `letters` (the stop tokens
/// excepted, so the text can still end): adds `-inf` to their logits.
struct Lipogram {
    /// 0 for allowed tokens, `-inf` for banned ones, float32 `[1, vocab]`.
    mask: Array,
}

impl Lipogram {
    /// The mask over a vocabulary of `vocab` ids (ids the tokenizer cannot
    /// decode are banned too).
    fn new(tokenizer: &Tokenizer, vocab: usize, letters: &[char]) -> Result<Lipogram> {
        let stop_ids = tokenizer.stop_ids();
        let mask: Vec<f32> = (0..vocab as u32)
            .map(|id| match tokenizer.decode(&[id]) {
                _ if stop_ids.contains(&id) => 0.0,
                Ok(text) if !text.contains(letters) => 0.0,
                _ => f32::NEG_INFINITY,
            })
            .collect();
        Ok(Lipogram {
            mask: Array::from_slice(&mask, &[1, vocab as i32])?,
        })
    }
}

impl LogitsProcessor for Lipogram {
    fn process(&self, logits: &Array) -> Result<Array> {
        Ok(logits.astype(Dtype::Float32)?.add(&self.mask)?)
    }
}

/// The logits of the last position of `[1, L, V]` logits, as `[1, V]`.
fn last_position(logits: &Array) -> Result<Array> {
    let shape = logits.shape();
    let (l, v) = (shape[1], shape[2]);
    Ok(logits
        .slice(&[0, l - 1, 0], &[1, l, v], &[1, 1, 1])?
        .reshape(&[1, v])?)
}

/// Continues `prompt` for at most `max_tokens` tokens, each drawn by
/// `sampler` from the logits `processor` made; stops at an end-of-turn or
/// end-of-sequence token. Returns the generated ids.
fn decode(
    engine: &Engine,
    prompt: &[u32],
    max_tokens: usize,
    processor: &dyn LogitsProcessor,
    sampler: &mut Sampler,
) -> Result<Vec<u32>> {
    let model = &engine.loaded.model;
    let stop_ids = engine.tokenizer()?.stop_ids();
    let mut caches = engine.new_caches(&GenerateOptions::default())?;
    let ids: Vec<i32> = prompt.iter().map(|&id| id as i32).collect();
    let mut input = Array::from_slice(&ids, &[1, ids.len() as i32])?;
    let mut generated = Vec::new();
    while generated.len() < max_tokens {
        let logits = last_position(&model.forward(&input, &mut caches)?)?;
        let token = sampler.sample(&processor.process(&logits)?, None)?;
        let id = token.item::<u32>()?;
        if stop_ids.contains(&id) {
            break;
        }
        generated.push(id);
        input = token.reshape(&[1, 1])?.astype(Dtype::Int32)?;
    }
    Ok(generated)
}

fn main() -> Result<()> {
    let engine = common::load_default_engine()?;
    let tokenizer = engine.tokenizer()?;
    let lipogram = Lipogram::new(
        tokenizer,
        engine.loaded.model.config.vocab_size,
        &['e', 'E'],
    )?;
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.7,
        top_k: Some(40),
        seed: 7,
        ..SamplerConfig::default()
    })?;

    let prompt = "A story about a cat:";
    let ids = decode(
        &engine,
        &engine.tokenize(prompt)?,
        16,
        &lipogram,
        &mut sampler,
    )?;
    let text = tokenizer.decode(&ids)?;
    println!("{prompt}{text}");
    ensure!(!ids.is_empty(), "no token generated");
    ensure!(
        !text.contains(['e', 'E']),
        "the lipogram let an \"e\" through: {text:?}"
    );
    Ok(())
}
