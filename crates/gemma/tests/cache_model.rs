//! The caches inside the model: a tiny random Gemma 3 (two sliding layers of
//! window 8, one global layer) gives the same logits for a 40-token sequence
//! whether it is computed in one forward, token by token, or in chunks of 7,
//! which drives the rotating cache through its ring buffer and through
//! chunked prefill past the window.

mod common;

use common::fixed_steps::max_diff;
use common::models::random_model;
use gemma::cache::{CacheFormat, KvFormat, KvStore, LayerCache, LayerFormats, Rotation};
use gemma::config::Gemma3Config;
use gemma::model::Gemma3;
use gemma::quant::GgufDtype;
use mlx_core::{concatenate, Array, Dtype};

const TOKENS: usize = 40;
const WINDOW: usize = 8;

fn tiny_config(window: usize) -> Gemma3Config {
    config_with_heads(window, 64)
}

/// The tiny configuration with heads of `head_dim` values.
fn config_with_heads(window: usize, head_dim: usize) -> Gemma3Config {
    let mut c = Gemma3Config::published("270m", Some(3)).expect("published config");
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = head_dim;
    c.query_pre_attn_scalar = head_dim as f32;
    c.intermediate_size = 128;
    c.vocab_size = 256;
    c.sliding_window = window;
    c.sliding_window_pattern = 3;
    c
}

fn tiny_model(window: usize) -> Gemma3 {
    let model = random_model(tiny_config(window), Dtype::Float32, 17);
    assert_eq!(model.layers.len(), 3);
    model
}

/// 40 token ids below the vocabulary size.
fn token_ids() -> Vec<i32> {
    (0..TOKENS as i32).map(|i| (i * 37 + 11) % 256).collect()
}

/// Logits `[TOKENS, vocab]` through caches of `formats`, computed in chunks
/// of `chunk` tokens (all at once for `TOKENS`).
fn logits(model: &Gemma3, formats: impl Into<LayerFormats>, chunk: usize) -> Vec<f32> {
    let mut caches = model.make_caches(formats).expect("caches");
    let ids = token_ids();
    let mut parts = Vec::new();
    for piece in ids.chunks(chunk) {
        let tokens = Array::from_slice(piece, &[1, piece.len() as i32]).expect("tokens");
        let out = model.forward(&tokens, &mut caches).expect("forward");
        let mut arrays = vec![&out];
        let held: Vec<&Array> = caches.iter().flat_map(LayerCache::arrays).collect();
        arrays.extend(held);
        mlx_core::eval(&arrays).expect("eval");
        parts.push(out);
    }
    assert!(caches.iter().all(|c| c.offset() == TOKENS as i32));
    let parts: Vec<&Array> = parts.iter().collect();
    let all = concatenate(&parts, 1).expect("concatenate");
    assert_eq!(all.shape(), vec![1, TOKENS as i32, 256]);
    all.to_vec::<f32>().expect("logits")
}

fn max_abs(a: &[f32]) -> f32 {
    a.iter().map(|x| x.abs()).fold(0.0, f32::max)
}

#[test]
fn the_tiny_config_is_sliding_sliding_global() {
    let c = tiny_config(WINDOW);
    assert_eq!(
        (0..3).map(|i| c.is_sliding(i)).collect::<Vec<_>>(),
        vec![true, true, false]
    );
    let model = tiny_model(WINDOW);
    let caches = model.make_caches(CacheFormat::COMPUTE).expect("caches");
    assert!(matches!(&caches[0], LayerCache::Rotating(r) if r.window() == WINDOW as i32));
    assert!(matches!(&caches[1], LayerCache::Rotating(_)));
    assert!(matches!(&caches[2], LayerCache::Plain(_)));
}

#[test]
fn float_cache_logits_do_not_depend_on_chunking() {
    let model = tiny_model(WINDOW);
    let whole = logits(&model, CacheFormat::COMPUTE, TOKENS);
    assert!(whole.iter().all(|x| x.is_finite()));
    let by_token = logits(&model, CacheFormat::COMPUTE, 1);
    let by_seven = logits(&model, CacheFormat::COMPUTE, 7);
    let (d1, d7) = (max_diff(&whole, &by_token), max_diff(&whole, &by_seven));
    println!(
        "float cache: max |logit| {:.4}, one-shot vs token-by-token {d1:e}, vs chunks of 7 {d7:e}",
        max_abs(&whole)
    );
    assert!(d1 < 1e-4, "token by token differs by {d1}");
    assert!(d7 < 1e-4, "chunks of 7 differ by {d7}");

    // The comparison can tell windows apart: with a window covering the
    // whole sequence the logits past position 8 move by far more than 1e-4.
    let wide = logits(&tiny_model(TOKENS), CacheFormat::COMPUTE, TOKENS);
    let past_window = 256 * WINDOW;
    let moved = max_diff(&whole[past_window..], &wide[past_window..]);
    let before = max_diff(&whole[..past_window], &wide[..past_window]);
    println!("window 8 vs window 40: positions < 8 differ by {before:e}, later ones by {moved:e}");
    assert!(
        before < 1e-4,
        "the first 8 positions see the same keys: {before}"
    );
    assert!(
        moved > 1e-2,
        "the window changes later logits by only {moved}"
    );
}

/// Keys and values quantized with `bits` bits in groups of 64.
fn quantized(bits: i32) -> CacheFormat {
    let q = KvFormat::Quantized {
        bits,
        group_size: 64,
    };
    CacheFormat {
        keys: q,
        values: q,
        ..CacheFormat::COMPUTE
    }
}

#[test]
fn eight_bit_cache_logits_are_finite_and_close() {
    let model = tiny_model(WINDOW);
    let float = logits(&model, CacheFormat::COMPUTE, TOKENS);
    let whole = logits(&model, quantized(8), TOKENS);
    let by_token = logits(&model, quantized(8), 1);
    let by_seven = logits(&model, quantized(8), 7);
    for (name, l) in [
        ("one-shot", &whole),
        ("token by token", &by_token),
        ("chunks of 7", &by_seven),
    ] {
        assert!(l.iter().all(|x| x.is_finite()), "{name}: non-finite logits");
    }
    let scale = max_abs(&float);
    let (d1, d7, dq) = (
        max_diff(&whole, &by_token),
        max_diff(&whole, &by_seven),
        max_diff(&whole, &float),
    );
    // Chunking changes float rounding upstream of the cache, which can move
    // a value across a quantization boundary: close, not identical.
    println!(
        "8-bit cache: one-shot vs token-by-token {d1:e}, vs chunks of 7 {d7:e}, \
         vs float cache {dq:e} (max |logit| {scale:.4})"
    );
    assert!(d1 < 0.01 * scale, "token by token differs by {d1}");
    assert!(d7 < 0.01 * scale, "chunks of 7 differ by {d7}");
    assert!(dq < 0.05 * scale, "8-bit vs float cache differs by {dq}");
    // The error is quantization's: 4 bits are an order of magnitude worse.
    let d4 = max_diff(&logits(&model, quantized(4), TOKENS), &float);
    println!("4-bit cache vs float cache {d4:e}");
    assert!(d4 > 4.0 * dq, "4-bit error {d4} vs 8-bit error {dq}");
}

#[test]
fn turbo_cache_logits_are_close_whatever_the_chunking() {
    // Heads of 128 values: one TurboQuant group each.
    let model = random_model(config_with_heads(WINDOW, 128), Dtype::Float32, 17);
    let float = logits(&model, CacheFormat::COMPUTE, TOKENS);
    let scale = max_abs(&float);
    let t = |bits| KvFormat::Turbo { bits };
    let mixed = CacheFormat {
        keys: KvFormat::Quantized {
            bits: 8,
            group_size: 64,
        },
        values: t(3),
        ..CacheFormat::COMPUTE
    };
    let mut errors = Vec::new();
    for (name, format) in [
        (
            "turbo4",
            CacheFormat {
                keys: t(4),
                values: t(4),
                ..CacheFormat::COMPUTE
            },
        ),
        (
            "turbo2",
            CacheFormat {
                keys: t(2),
                values: t(2),
                ..CacheFormat::COMPUTE
            },
        ),
        ("q8_0/turbo3", mixed),
    ] {
        let whole = logits(&model, format, TOKENS);
        let by_token = logits(&model, format, 1);
        let by_seven = logits(&model, format, 7);
        let (d1, d7, dq) = (
            max_diff(&whole, &by_token),
            max_diff(&whole, &by_seven),
            max_diff(&whole, &float),
        );
        println!(
            "{name} cache: one-shot vs token-by-token {d1:e}, vs chunks of 7 {d7:e}, \
             vs float cache {dq:e} (max |logit| {scale:.4})"
        );
        assert!(
            whole.iter().all(|x| x.is_finite()),
            "{name}: non-finite logits"
        );
        assert!(d1 < 0.01 * scale, "{name}: token by token differs by {d1}");
        assert!(d7 < 0.01 * scale, "{name}: chunks of 7 differ by {d7}");
        errors.push(dq);
    }
    // 2 bits lose more than 4 bits.
    assert!(
        errors[1] > errors[0],
        "turbo2 {} vs turbo4 {}",
        errors[1],
        errors[0]
    );
}

#[test]
fn a_float16_cache_under_a_bfloat16_model_keeps_the_stream_in_bfloat16() {
    let model = random_model(tiny_config(WINDOW), Dtype::Bfloat16, 17);
    let f16 = KvFormat::Float(Some(Dtype::Float16));
    let format = CacheFormat {
        keys: f16,
        values: f16,
        ..CacheFormat::COMPUTE
    };
    let mut caches = model.make_caches(format).expect("caches");
    let tokens = Array::from_slice(&token_ids()[..5], &[1, 5]).expect("tokens");
    let hidden = model.hidden(&tokens, &mut caches).expect("forward");
    assert_eq!(hidden.dtype(), Dtype::Bfloat16);
}

#[test]
fn make_caches_rejects_formats_mlx_cannot_store() {
    let model = tiny_model(WINDOW);
    let bad = [
        (
            KvFormat::Quantized {
                bits: 7,
                group_size: 64,
            },
            "2, 3, 4, 5, 6, 8",
        ),
        (
            KvFormat::Quantized {
                bits: 4,
                group_size: 48,
            },
            "32, 64, 128",
        ),
        (
            KvFormat::Quantized {
                bits: 4,
                group_size: 128,
            },
            "head dimension 64",
        ),
    ];
    for (format, needle) in bad {
        for cache_format in [
            CacheFormat {
                keys: format,
                values: KvFormat::Float(None),
                ..CacheFormat::COMPUTE
            },
            CacheFormat {
                keys: KvFormat::Float(None),
                values: format,
                ..CacheFormat::COMPUTE
            },
        ] {
            let message = model
                .make_caches(cache_format)
                .expect_err("an invalid format")
                .to_string();
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        }
    }
}

#[test]
fn each_layer_stores_the_format_its_policy_gives_it() {
    let model = random_model(config_with_heads(WINDOW, 128), Dtype::Float32, 17);
    let per_layer = [
        CacheFormat {
            keys: KvFormat::Block(GgufDtype::Q8_0),
            values: KvFormat::Turbo { bits: 2 },
            ..CacheFormat::COMPUTE
        },
        CacheFormat {
            keys: KvFormat::Quantized {
                bits: 4,
                group_size: 32,
            },
            values: KvFormat::Block(GgufDtype::IQ4_NL),
            ..CacheFormat::COMPUTE
        },
        CacheFormat {
            keys: KvFormat::Turbo { bits: 4 },
            values: KvFormat::Float(Some(Dtype::Float16)),
            ..CacheFormat::COMPUTE
        },
    ];
    let mut caches = model
        .make_caches(LayerFormats::PerLayer(per_layer.to_vec()))
        .expect("caches");
    let tokens = Array::from_slice(&token_ids()[..12], &[1, 12]).expect("tokens");
    let out = model.forward(&tokens, &mut caches).expect("forward");
    mlx_core::eval(&[&out]).expect("eval");
    for (i, (cache, asked)) in caches.iter().zip(per_layer).enumerate() {
        let arrays: Vec<Array> = cache.arrays().into_iter().cloned().collect();
        let (keys, used) = KvStore::from_arrays(&arrays, 128).expect("keys");
        let (values, _) = KvStore::from_arrays(&arrays[used..], 128).expect("values");
        assert_eq!(
            (keys.format(), values.format()),
            (asked.keys, asked.values),
            "layer {i}"
        );
    }
    // The same policy in every layer is the uniform cache.
    let uniform = logits(&model, per_layer[1], TOKENS);
    let listed = logits(
        &model,
        LayerFormats::PerLayer(vec![per_layer[1]; 3]),
        TOKENS,
    );
    assert_eq!(uniform, listed);
    let short = model.make_caches(LayerFormats::PerLayer(per_layer[..2].to_vec()));
    let err = short.expect_err("two formats for three layers").to_string();
    assert!(
        err.contains("2 per-layer formats") && err.contains("3 layers"),
        "{err}"
    );
}

#[test]
fn a_rotated_float_cache_gives_the_unrotated_logits() {
    // Heads of 128 values: keys rotate in one run of 128, values in two of 64.
    let model = random_model(config_with_heads(WINDOW, 128), Dtype::Float32, 17);
    let with = |format: CacheFormat, rotation: Rotation, chunk: usize| {
        logits(&model, CacheFormat { rotation, ..format }, chunk)
    };
    let plain = with(CacheFormat::COMPUTE, Rotation::NONE, TOKENS);
    let scale = max_abs(&plain);
    for (keys, values) in [(true, false), (false, true), (true, true)] {
        let rotation = Rotation { keys, values };
        // One forward, token by token, and chunks of 7 through the window.
        for chunk in [TOKENS, 1, 7] {
            let d = max_diff(&plain, &with(CacheFormat::COMPUTE, rotation, chunk));
            println!("{rotation:?}, chunks of {chunk}: {d:e} (max |logit| {scale:.4})");
            assert!(d < 1e-5 * scale, "{rotation:?}, chunks of {chunk}: {d}");
        }
    }
    // Over 4-bit blocks the rotation changes what quantization loses, not
    // its size (random vectors have no outliers for it to spread).
    let q4 = CacheFormat {
        keys: KvFormat::Block(GgufDtype::Q4_0),
        values: KvFormat::Block(GgufDtype::Q4_0),
        ..CacheFormat::COMPUTE
    };
    let both = Rotation {
        keys: true,
        values: true,
    };
    let (unrotated, rotated) = (
        max_diff(&plain, &with(q4, Rotation::NONE, TOKENS)),
        max_diff(&plain, &with(q4, both, TOKENS)),
    );
    println!("q4_0 against float: {unrotated:e} unrotated, {rotated:e} rotated");
    assert!(rotated > 0.0 && rotated != unrotated && rotated < 2.0 * unrotated);
}
