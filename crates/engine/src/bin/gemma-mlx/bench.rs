//! `bench`: the cases of a benchmark plan, timed in one process (for
//! `cargo xtask bench`, beside `xtask/bench/mlx_lm_bench.py`, which reads the
//! same plan and prints the same fields).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use engine::options::default_decode;
use engine::{generate, Engine, GenerateOptions, Generation};
use gemma::cache::{CacheFormat, KvFormat, LayerCache};
use mlx_core::memory;
use sample::SamplerConfig;
use serde::Deserialize;
use serde_json::json;

use crate::model_args::ModelArgs;
use crate::output::print_json;

/// `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The plan: JSON with `cases` (see `xtask/bench/mlx_lm_bench.py`).
    #[arg(long)]
    pub plan: PathBuf,
    /// Also measure active memory beyond weights and KV cache after
    /// decoding each of these token counts (ascending), in one generation.
    #[arg(long, value_delimiter = ',')]
    pub flatness: Vec<usize>,
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
}

/// A benchmark plan.
#[derive(Debug, Deserialize)]
struct Plan {
    /// Run the first case briefly before timing anything.
    #[serde(default)]
    warmup: bool,
    /// Added to token logits (id as a string → bias), on every case.
    #[serde(default)]
    logit_bias: BTreeMap<String, f32>,
    /// The cases, run in order, each with a fresh cache.
    cases: Vec<Case>,
}

/// One timed generation.
#[derive(Debug, Clone, Deserialize)]
struct Case {
    name: String,
    prompt: Vec<u32>,
    max_tokens: usize,
    /// Quantize the cache to this many bits (global layers only, unless
    /// `kv_all_layers`).
    #[serde(default)]
    kv_bits: Option<i32>,
    #[serde(default = "default_group")]
    kv_group_size: i32,
    /// Quantize the sliding-window layers' caches too.
    #[serde(default)]
    kv_all_layers: bool,
}

fn default_group() -> i32 {
    64
}

/// Runs the plan and prints one JSON object with a result per case.
pub fn bench(args: BenchArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.plan)
        .with_context(|| format!("cannot read {}", args.plan.display()))?;
    let plan: Plan = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a benchmark plan", args.plan.display()))?;
    let bias = parse_bias(&plan.logit_bias, &args)?;
    let engine = args.model.load(true)?;
    if plan.warmup {
        if let Some(first) = plan.cases.first() {
            let warm = Case {
                max_tokens: first.max_tokens.min(4),
                ..first.clone()
            };
            run_case(&engine, &warm, &bias)?;
        }
    }
    let mut results = Vec::with_capacity(plan.cases.len());
    for case in &plan.cases {
        let generation = run_case(&engine, case, &bias)?;
        let m = &generation.metrics;
        results.push(json!({
            "name": case.name,
            "token_ids": generation.token_ids,
            "prompt_tokens": m.prompt_tokens,
            "prompt_tps": m.prompt_tps,
            "generation_tokens": m.generation_tokens,
            "generation_tps": m.generation_tps,
            "ttft_s": m.ttft_s,
            "peak_memory_bytes": m.peak_memory_bytes,
            "decode_host": m.decode_host,
        }));
    }
    let flatness = match plan.cases.first() {
        Some(first) if !args.flatness.is_empty() => {
            Some(flatness(&engine, &first.prompt, &args.flatness, &bias)?)
        }
        _ => None,
    };
    print_json(&json!({
        "engine": format!("gemma-mlx {}", env!("CARGO_PKG_VERSION")),
        "mlx_version": mlx_core::device::mlx_version(),
        "results": results,
        "flatness": flatness,
    }))
}

fn parse_bias(bias: &BTreeMap<String, f32>, args: &BenchArgs) -> Result<Vec<(u32, f32)>> {
    bias.iter()
        .map(|(id, value)| {
            let id = id.parse().with_context(|| {
                format!(
                    "{}: logit_bias key '{id}' is not a token id",
                    args.plan.display()
                )
            })?;
            Ok((id, *value))
        })
        .collect()
}

fn options(max_tokens: usize, bias: &[(u32, f32)]) -> Result<GenerateOptions> {
    let sampler = SamplerConfig {
        temperature: 0.0,
        logit_bias: bias.to_vec(),
        ..SamplerConfig::default()
    };
    sampler.validate()?;
    Ok(GenerateOptions {
        max_tokens,
        sampler,
        ..GenerateOptions::default()
    })
}

/// Fresh caches for `case`: quantized ones in the layers it asks for.
fn caches(engine: &Engine, case: &Case) -> Result<Vec<LayerCache>> {
    let model = &engine.loaded.model;
    let plain = model.make_caches(CacheFormat::COMPUTE)?;
    let Some(bits) = case.kv_bits else {
        return Ok(plain);
    };
    let quantized_format = KvFormat::Quantized {
        bits,
        group_size: case.kv_group_size,
    };
    let quantized = model.make_caches(CacheFormat {
        keys: quantized_format,
        values: quantized_format,
        ..CacheFormat::COMPUTE
    })?;
    Ok(plain
        .into_iter()
        .zip(quantized)
        .enumerate()
        .map(|(layer, (plain, quantized))| {
            if case.kv_all_layers || !model.config.is_sliding(layer) {
                quantized
            } else {
                plain
            }
        })
        .collect())
}

/// One case, decoded as `generate` decodes on the command line
/// ([`default_decode`]: the compiled step where every block runs as one
/// kernel of ours).
fn run_case(engine: &Engine, case: &Case, bias: &[(u32, f32)]) -> Result<Generation> {
    let mut caches = caches(engine, case)?;
    let options = GenerateOptions {
        decode: default_decode(&engine.loaded.model)?,
        ..options(case.max_tokens, bias)?
    };
    memory::clear_cache()?;
    generate(
        &engine.loaded.model,
        engine.loaded.tokenizer.as_ref(),
        &case.prompt,
        &mut caches,
        &options,
        &mut |_| {},
    )
    .with_context(|| format!("bench case '{}'", case.name))
}

/// Decodes from `prompt` with a plain cache, pausing after each count of
/// `marks` generated tokens to read MLX's active memory less the weights and
/// the KV caches' bytes.
fn flatness(
    engine: &Engine,
    prompt: &[u32],
    marks: &[usize],
    bias: &[(u32, f32)],
) -> Result<serde_json::Value> {
    if marks.windows(2).any(|w| w[0] >= w[1]) || marks.first() == Some(&0) {
        bail!("--flatness wants ascending token counts above 0, got {marks:?}");
    }
    let model = &engine.loaded.model;
    let weights = model.weight_bytes();
    let mut caches = model.make_caches(CacheFormat::COMPUTE)?;
    let mut input = prompt.to_vec();
    let mut decoded = 0;
    let mut points = Vec::with_capacity(marks.len());
    for &mark in marks {
        let generation = generate(
            model,
            engine.loaded.tokenizer.as_ref(),
            &input,
            &mut caches,
            &options(mark - decoded, bias)?,
            &mut |_| {},
        )?;
        decoded += generation.token_ids.len();
        let kv: usize = caches.iter().map(LayerCache::nbytes).sum();
        memory::clear_cache()?;
        let active = memory::active_bytes()?;
        points.push(json!({
            "decoded_tokens": decoded,
            "active_bytes": active,
            "weight_bytes": weights,
            "kv_bytes": kv,
            "other_bytes": active as i64 - (weights + kv) as i64,
        }));
        // The last generated token was sampled but not fed: it starts the next leg.
        input = generation.token_ids.last().copied().into_iter().collect();
        if input.is_empty() {
            break;
        }
    }
    Ok(json!(points))
}
