//! Op-level benchmarks at the shapes of one Gemma 3 size: matmuls (dense and
//! MLX-quantized), scaled-dot-product attention, RMS norm, RoPE and one token
//! written into a 2048-token KV cache. Every iteration evaluates its result
//! (MLX is lazy). `BENCH_DEVICE=gpu` runs them on the GPU in bfloat16 with the
//! 1B shape (see `benches::settings`).

use std::time::Duration;

use benches::inputs::random_array;
use benches::{or_exit, BenchError, Settings};
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use gemma::cache::{CacheFormat, KeyMask, KvCache, KvFormat};
use gemma::config::Gemma3Config;
use mlx_core::fast::{rms_norm, rope, scaled_dot_product_attention, AttentionMask, RopeOffset};
use mlx_core::quantize;

/// Group size of every quantization measured.
const GROUP: i32 = 64;
/// Positions of a prompt chunk.
const PROMPT: i32 = 512;
/// Tokens already in the cache that one new token is written into.
const CACHED: i32 = 2048;

fn main() {
    let settings = or_exit(Settings::from_env());
    let config = or_exit(settings.config());
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    or_exit(matmuls(&mut c, &settings, &config));
    or_exit(attention(&mut c, &settings, &config));
    or_exit(norms_and_rope(&mut c, &settings, &config));
    or_exit(cache_update(&mut c, &settings, &config));
    c.final_summary();
}

/// `x @ Wᵀ` for the MLP input (decode and prompt) and the output projection
/// (decode), dense and quantized to 8 and 4 bits. Throughput is weight bytes.
fn matmuls(c: &mut Criterion, s: &Settings, cfg: &Gemma3Config) -> Result<(), BenchError> {
    let (h, inter, vocab) = (
        cfg.hidden_size as i32,
        cfg.intermediate_size as i32,
        cfg.vocab_size as i32,
    );
    let x1 = random_array(&[1, h], s.dtype, 1.0, 1)?;
    let x512 = random_array(&[PROMPT, h], s.dtype, 1.0, 2)?;
    let cases = [
        ("mlp_in", inter, &x1),
        ("mlp_in_prompt512", inter, &x512),
        ("lm_head", vocab, &x1),
    ];
    let mut group = c.benchmark_group(format!("{}/matmul", s.label()));
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    for (seed, (name, rows, x)) in (10..).zip(cases) {
        let w = random_array(&[rows, h], s.dtype, 0.02, seed)?;
        let shape = format!("{}x{h}_by_{rows}x{h}T", x.dim(0)?);
        group.throughput(Throughput::Bytes(w.nbytes() as u64));
        group.bench_function(BenchmarkId::new(format!("{name}/dense"), &shape), |b| {
            b.iter(|| or_exit(x.matmul(&or_exit(w.t())).and_then(|y| y.eval())))
        });
        for bits in [8, 4] {
            let q = quantize(&w, GROUP, bits)?;
            mlx_core::eval(&[&q.packed, &q.scales, &q.biases])?;
            group.throughput(Throughput::Bytes(q.nbytes() as u64));
            let id = BenchmarkId::new(format!("{name}/q{bits}g{GROUP}"), &shape);
            group.bench_function(id, |b| {
                b.iter(|| or_exit(q.matmul(x, true).and_then(|y| y.eval())))
            });
        }
    }
    group.finish();
    Ok(())
}

/// Grouped-query attention of one query over 128 / 2048 / 8192 keys, and of
/// a 512-token prompt over itself under a causal mask.
fn attention(c: &mut Criterion, s: &Settings, cfg: &Gemma3Config) -> Result<(), BenchError> {
    let (hq, hkv, d) = (
        cfg.num_attention_heads as i32,
        cfg.num_key_value_heads as i32,
        cfg.head_dim as i32,
    );
    let scale = cfg.attention_scale();
    let mut group = c.benchmark_group(format!("{}/sdpa", s.label()));
    let q1 = random_array(&[1, hq, 1, d], s.dtype, 1.0, 20)?;
    for keys in [128, 2048, 8192] {
        let k = random_array(&[1, hkv, keys, d], s.dtype, 1.0, 21)?;
        let v = random_array(&[1, hkv, keys, d], s.dtype, 1.0, 22)?;
        group.bench_function(BenchmarkId::new("decode", keys), |b| {
            b.iter(|| {
                or_exit(
                    scaled_dot_product_attention(&q1, &k, &v, scale, AttentionMask::None)
                        .and_then(|y| y.eval()),
                )
            })
        });
    }
    let q = random_array(&[1, hq, PROMPT, d], s.dtype, 1.0, 23)?;
    let k = random_array(&[1, hkv, PROMPT, d], s.dtype, 1.0, 24)?;
    let v = random_array(&[1, hkv, PROMPT, d], s.dtype, 1.0, 25)?;
    group.bench_function(BenchmarkId::new("prompt_causal", PROMPT), |b| {
        b.iter(|| {
            or_exit(
                scaled_dot_product_attention(&q, &k, &v, scale, AttentionMask::Causal)
                    .and_then(|y| y.eval()),
            )
        })
    });
    group.finish();
    Ok(())
}

/// RMS norm of hidden states and RoPE of query heads, for one token and for
/// a 512-token prompt.
fn norms_and_rope(c: &mut Criterion, s: &Settings, cfg: &Gemma3Config) -> Result<(), BenchError> {
    let (h, hq, d) = (
        cfg.hidden_size as i32,
        cfg.num_attention_heads as i32,
        cfg.head_dim as i32,
    );
    let eps = cfg.rms_norm_eps;
    let weight = random_array(&[h], s.dtype, 0.1, 30)?;
    let mut group = c.benchmark_group(format!("{}/rms_norm", s.label()));
    for rows in [1, PROMPT] {
        let x = random_array(&[rows, h], s.dtype, 1.0, 31)?;
        group.bench_function(BenchmarkId::from_parameter(format!("{rows}x{h}")), |b| {
            b.iter(|| or_exit(rms_norm(&x, Some(&weight), eps).and_then(|y| y.eval())))
        });
    }
    group.finish();

    let base = cfg.rope_local_base_freq;
    let mut group = c.benchmark_group(format!("{}/rope", s.label()));
    for (positions, start) in [(1, CACHED), (PROMPT, 0)] {
        let x = random_array(&[1, hq, positions, d], s.dtype, 1.0, 32)?;
        let id = BenchmarkId::from_parameter(format!("1x{hq}x{positions}x{d}"));
        group.bench_function(id, |b| {
            b.iter(|| {
                or_exit(
                    rope(&x, d, false, base, 1.0, RopeOffset::Fixed(start)).and_then(|y| y.eval()),
                )
            })
        });
    }
    group.finish();
    Ok(())
}

/// One token's keys and values written into a cache holding 2048 tokens
/// (`KvCache::update_and_fetch`, then evaluation of the cache and the mask),
/// unquantized and at 8 and 4 bits. The cache forgets the token after each
/// iteration, so every iteration writes at the same place.
fn cache_update(c: &mut Criterion, s: &Settings, cfg: &Gemma3Config) -> Result<(), BenchError> {
    let (hkv, d) = (cfg.num_key_value_heads as i32, cfg.head_dim as i32);
    let prompt_k = random_array(&[1, hkv, CACHED, d], s.dtype, 1.0, 40)?;
    let prompt_v = random_array(&[1, hkv, CACHED, d], s.dtype, 1.0, 41)?;
    let k = random_array(&[1, hkv, 1, d], s.dtype, 1.0, 42)?;
    let v = random_array(&[1, hkv, 1, d], s.dtype, 1.0, 43)?;
    let formats = [
        ("float", KvFormat::Float(None)),
        (
            "q8",
            KvFormat::Quantized {
                bits: 8,
                group_size: GROUP,
            },
        ),
        (
            "q4",
            KvFormat::Quantized {
                bits: 4,
                group_size: GROUP,
            },
        ),
    ];
    let mut group = c.benchmark_group(format!("{}/kv_cache_update", s.label()));
    for (name, format) in formats {
        let mut cache = KvCache::new(CacheFormat {
            keys: format,
            values: format,
            ..CacheFormat::COMPUTE
        });
        cache.update_and_fetch(&prompt_k, &prompt_v)?;
        mlx_core::eval(&cache.arrays())?;
        group.bench_function(BenchmarkId::new(name, CACHED), |b| {
            b.iter(|| {
                let attend = or_exit(cache.update_and_fetch(&k, &v));
                let mut arrays = cache.arrays();
                if let KeyMask::Array(mask) = &attend.mask {
                    arrays.push(mask);
                }
                or_exit(mlx_core::eval(&arrays));
                cache.trim(1);
            })
        });
    }
    group.finish();
    Ok(())
}
