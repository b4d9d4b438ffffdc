//! The sampling and generation flags, and the generation options they make
//! (shared by the one-shot commands and the worker).

use anyhow::Result;
use clap::Args;
use engine::options::{default_decode, default_prefill_chunk, default_steps_per_sync, DecodeMode};
use engine::{Engine, GenerateOptions, KvSpec};
use sample::SamplerConfig;

use crate::model_args::ModelArgs;

/// Sampling and generation settings, named as mlx-lm names them.
#[derive(Debug, Args, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temp: f32,
    /// Keep only the k most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p.
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than min-p times the most likely one.
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Penalty for tokens in the recent window (> 1 discourages repeats).
    #[arg(long, allow_negative_numbers = true)]
    pub repetition_penalty: Option<f32>,
    /// How many recent tokens the repetition penalty looks at.
    #[arg(long, default_value_t = 20)]
    pub repetition_context_size: usize,
    /// Subtracted from the logit of every token in the recent window.
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// How many recent tokens the presence penalty looks at.
    #[arg(long, default_value_t = 20)]
    pub presence_context_size: usize,
    /// Subtracted once per occurrence in the recent window.
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// How many recent tokens the frequency penalty looks at.
    #[arg(long, default_value_t = 20)]
    pub frequency_context_size: usize,
    /// XTC: the probability, per token, of removing every token more likely
    /// than `--xtc-threshold` except the least likely of them (never the
    /// newline and end-of-sequence tokens).
    #[arg(long)]
    pub xtc_probability: Option<f32>,
    /// XTC's probability threshold, in [0, 0.5].
    #[arg(long, default_value_t = 0.1)]
    pub xtc_threshold: f32,
    /// Added to a token's logit: ID=BIAS, repeatable.
    #[arg(long = "logit-bias", value_parser = parse_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// KV-cache format, e.g. `ctk=q8_0,ctv=q4_0,group=64`.
    #[arg(long)]
    pub kv: Option<String>,
    /// Prompt tokens per forward pass (default: 256 on cpu, 2048 on gpu).
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// How tokens after the prompt are decoded: `compiled` runs one
    /// fixed-shape step compiled by MLX (every KV cache format; eager where a
    /// cache changes format during the generation). Default: compiled where
    /// the step runs every block as one kernel of ours (on the GPU with our
    /// kernels; on the CPU with `--weights native` and every projection on
    /// our kernels), eager otherwise.
    #[arg(long, value_enum)]
    pub decode: Option<DecodeMode>,
    /// Decode steps queued on the device per host-device synchronisation
    /// (default: 1 on cpu, 16 on gpu); tokens then arrive in bursts.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub steps_per_sync: Option<u64>,
}

fn parse_bias(text: &str) -> Result<(u32, f32), String> {
    let (id, bias) = text
        .split_once('=')
        .ok_or_else(|| format!("'{text}' is not ID=BIAS"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("'{id}' is not a token id"))?;
    let bias = bias
        .trim()
        .parse()
        .map_err(|_| format!("'{bias}' is not a number"))?;
    Ok((id, bias))
}

/// A KV spec, parsed, with a note on stderr for each type name whose
/// meaning changed (see [`KvSpec::notes`]).
pub fn parse_spec(text: &str) -> Result<KvSpec> {
    let spec = KvSpec::parse(text)?;
    print_notes(&[&spec]);
    Ok(spec)
}

/// Prints on stderr, once each, the notes of `specs` (see [`KvSpec::notes`]).
pub fn print_notes(specs: &[&KvSpec]) {
    let notes: std::collections::BTreeSet<String> = specs.iter().flat_map(|s| s.notes()).collect();
    for note in notes {
        eprintln!("note: {note}");
    }
}

/// The options `sampling` asks for; what it leaves unset takes the defaults
/// of `model`'s device (which this places the computation on), but for
/// what [`fit_to_model`] settles once the model is loaded.
pub fn options(sampling: &SamplingArgs, model: &ModelArgs) -> Result<GenerateOptions> {
    let device = model.place()?;
    let spec = parse_spec(sampling.kv.as_deref().unwrap_or(""))?;
    let sampler = SamplerConfig {
        temperature: sampling.temp,
        top_k: sampling.top_k,
        top_p: sampling.top_p,
        min_p: sampling.min_p,
        repetition_penalty: sampling.repetition_penalty,
        presence_penalty: sampling.presence_penalty,
        frequency_penalty: sampling.frequency_penalty,
        repetition_window: sampling.repetition_context_size,
        presence_window: sampling.presence_context_size,
        frequency_window: sampling.frequency_context_size,
        xtc_probability: sampling.xtc_probability,
        xtc_threshold: sampling.xtc_threshold,
        logit_bias: sampling.logit_bias.clone(),
        seed: sampling.seed,
        ..SamplerConfig::default()
    };
    sampler.validate()?;
    let defaults = GenerateOptions::default();
    Ok(GenerateOptions {
        max_tokens: sampling.max_tokens,
        sampler,
        stop_strings: sampling.stop.clone(),
        kv_start: spec.start,
        kv_queries: spec.queries,
        prefill_chunk: sampling
            .prefill_chunk
            .unwrap_or(default_prefill_chunk(device)),
        decode: sampling.decode.unwrap_or_default(),
        steps_per_sync: sampling
            .steps_per_sync
            .map_or(default_steps_per_sync(device), |n| n as usize),
        ..defaults
    })
}

/// Settles what `options` (from [`options`]) take from the loaded model:
/// each layer's cache format (a spec's layer parts name layers by kind and
/// count),
/// the decoding mode unless `sampling` asked for one ([`default_decode`]),
/// and XTC kept off the newline and end-of-sequence tokens, as mlx-lm's
/// command line does (a model without tokenizer: its end-of-sequence ids).
pub fn fit_to_model(
    options: &mut GenerateOptions,
    sampling: &SamplingArgs,
    engine: &Engine,
) -> Result<()> {
    options.cache_formats = KvSpec::parse(sampling.kv.as_deref().unwrap_or(""))?
        .layer_formats(&engine.loaded.model.config)?;
    if sampling.decode.is_none() {
        options.decode = default_decode(&engine.loaded.model)?;
    }
    if options.sampler.xtc_probability.is_none() {
        return Ok(());
    }
    let mut ids = engine.loaded.model.config.eos_token_ids.clone();
    if let Some(tokenizer) = engine.loaded.tokenizer.as_ref() {
        ids.extend(tokenizer.encode_plain("\n")?);
        ids.extend(tokenizer.stop_ids());
    }
    ids.sort_unstable();
    ids.dedup();
    options.sampler.xtc_special_tokens = ids;
    Ok(())
}
