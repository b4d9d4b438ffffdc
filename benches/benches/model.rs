//! Model-level benchmarks: one decode step at contexts of 128, 2048 and 8192
//! tokens, a 512-token prompt, and one 512-token chunk of the KLD sweep with
//! one 8-bit candidate. On the CPU (float32) the model is the default GGUF
//! file when present, random weights of the 270M shape otherwise;
//! `BENCH_DEVICE=gpu` uses random bfloat16 weights of the 1B shape. The
//! decode step runs eagerly (`decode_step/context`) and as the compiled
//! fixed-shape step (`context_compiled`); on the GPU also both with our GPU
//! kernels in place of MLX's operations (`…_gpu_kernels`).

use std::time::Duration;

use benches::decode::{prompt_logits, DecodeStep};
use benches::inputs::{load_model, random_tokens};
use benches::{or_exit, BenchError, Settings};
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use engine::kld::sweep::{chunks, sweep, ChunkSettings, Side};
use gemma::cache::{CacheFormat, KvFormat, QueryRounding};
use gemma::model::Gemma3;
use mlx_core::Device;

/// Context lengths of the decode step.
const CONTEXTS: [usize; 3] = [128, 2048, 8192];
/// Tokens of the prompt and of the KLD chunk.
const PROMPT: usize = 512;

fn main() {
    let settings = or_exit(Settings::from_env());
    let loaded = or_exit(load_model(&settings));
    eprintln!(
        "model: {} ({} MB of weights, {})",
        loaded.name,
        loaded.model.weight_bytes() / 1_000_000,
        settings.label()
    );
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    let model = &loaded.model;
    or_exit(decode_steps(&mut c, &settings, model));
    or_exit(prompt(&mut c, &settings, model));
    or_exit(kld_chunk(&mut c, &settings, model));
    c.final_summary();
}

/// One token forward (logits and caches evaluated) after `context` tokens.
fn decode_steps(c: &mut Criterion, s: &Settings, model: &Gemma3) -> Result<(), BenchError> {
    let mut group = c.benchmark_group(format!("{}/decode_step", s.label()));
    group
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Elements(1));
    // On the GPU, also with our kernels in place of MLX's operations.
    let mut kernels = model.clone();
    kernels.gpu_kernels = true;
    let variants: &[(&str, &Gemma3, bool)] = if s.device == Device::Gpu {
        &[
            ("context", model, false),
            ("context_compiled", model, true),
            ("context_gpu_kernels", &kernels, false),
            ("context_compiled_gpu_kernels", &kernels, true),
        ]
    } else {
        &[("context", model, false), ("context_compiled", model, true)]
    };
    for (seed, context) in (1..).zip(CONTEXTS) {
        for &(name, variant, compiled) in variants {
            let mut step = DecodeStep::new(variant, CacheFormat::COMPUTE, context, seed, compiled)?;
            group.bench_function(BenchmarkId::new(name, context), |b| {
                b.iter(|| or_exit(step.run()))
            });
        }
    }
    group.finish();
    Ok(())
}

/// A 512-token prompt into fresh caches, up to the logits of its last token.
fn prompt(c: &mut Criterion, s: &Settings, model: &Gemma3) -> Result<(), BenchError> {
    let tokens = random_tokens(PROMPT, model.config.vocab_size, 100)?;
    let mut group = c.benchmark_group(format!("{}/prompt", s.label()));
    group
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Elements(PROMPT as u64));
    group.bench_function(BenchmarkId::new("tokens", PROMPT), |b| {
        b.iter(|| {
            let mut caches = or_exit(model.make_caches(CacheFormat::COMPUTE));
            or_exit(prompt_logits(model, &mut caches, &tokens))
        })
    });
    group.finish();
    Ok(())
}

/// One chunk of the KLD sweep: the reference (unquantized cache) and one
/// candidate (8-bit keys and values, group 64) over 512 tokens, with the
/// per-position divergences.
fn kld_chunk(c: &mut Criterion, s: &Settings, model: &Gemma3) -> Result<(), BenchError> {
    let settings = ChunkSettings {
        ctx: PROMPT,
        chunks: 1,
        bos: Some(model.config.bos_token_id),
        second_half: false,
        two_forwards: false,
    };
    let tokens = random_tokens(PROMPT, model.config.vocab_size, 200)?;
    let corpus = chunks(&tokens, &settings)?;
    let reference = Side {
        model,
        formats: CacheFormat::COMPUTE.into(),
        start: 0,
        queries: QueryRounding::Exact,
    };
    let q8 = KvFormat::Quantized {
        bits: 8,
        group_size: 64,
    };
    let candidate = Side {
        model,
        formats: CacheFormat {
            keys: q8,
            values: q8,
            ..CacheFormat::COMPUTE
        }
        .into(),
        start: 0,
        queries: QueryRounding::Exact,
    };
    let mut group = c.benchmark_group(format!("{}/kld_chunk", s.label()));
    group
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Elements(PROMPT as u64));
    group.bench_function(BenchmarkId::new("q8_tokens", PROMPT), |b| {
        b.iter(|| {
            or_exit(sweep(
                &reference,
                std::slice::from_ref(&candidate),
                &corpus,
                &settings,
                &mut |_, _| {},
            ))
        })
    });
    group.finish();
    Ok(())
}
