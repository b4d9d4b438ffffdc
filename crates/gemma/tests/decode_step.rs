//! The fixed-shape decode step against the eager forward pass, on the tiny
//! random Gemma 3 of `common::models::tiny_config` (sliding, sliding,
//! global, sliding; 2 key/value heads of 64): 40 tokens fed as a 5-token
//! eager prefill, 30 fixed-shape steps and a 5-token eager chunk give the
//! logits of the eager pass fed the whole sequence at once, compiled or not,
//! with a window of 8 (the ring wraps several times) and of 300 (the ring
//! buffer is reserved short of the window); and compressed caches (affine
//! and TurboQuant, mixed, after float tokens) give through compiled steps
//! the logits and greedy tokens of the eager pass fed one token at a time.

mod common;

use common::fixed_steps::{
    eager, max_diff, mixed, scheduled, tiny_model, tiny_model_with_heads, tokens, Steps, TOKENS,
    VOCAB,
};
use gemma::cache::{CacheFormat, KvFormat, LayerCache};
use gemma::forward::decode_step::DecodeStep;
use gemma::quant::GgufDtype;

#[test]
fn fixed_steps_give_the_logits_of_the_eager_pass() {
    for window in [8, 300] {
        let model = tiny_model(window);
        let reference = eager(&model);
        assert_eq!(reference.len(), TOKENS * VOCAB as usize);
        for compiled in [false, true] {
            let (logits, _) = mixed(&model, compiled);
            let d = max_diff(&reference, &logits);
            println!("window {window}, compiled {compiled}: max |Δ logit| {d:e}");
            assert!(d < 1e-4, "window {window}, compiled {compiled}: {d}");
        }
    }
}

#[test]
fn the_window_shapes_what_fixed_steps_see() {
    // Same weights (same seed and shapes), windows 8 and 300: the fixed steps
    // past position 8 must tell them apart, so the mask is not a no-op.
    let (narrow, _) = mixed(&tiny_model(8), true);
    let (wide, _) = mixed(&tiny_model(300), true);
    let v = VOCAB as usize;
    let before = max_diff(&narrow[..8 * v], &wide[..8 * v]);
    let after = max_diff(&narrow[9 * v..], &wide[9 * v..]);
    println!("windows 8 vs 300: first 8 positions {before:e}, from 9 on {after:e}");
    assert!(before < 1e-4, "{before}");
    assert!(after > 1e-2, "{after}");
}

#[test]
fn reserved_buffers_keep_their_shape_across_steps() {
    let model = tiny_model(300);
    let (_, caches) = mixed(&model, true);
    // Sliding layers: 40 positions fit in one step of 256 (short of the
    // window); the global layer: 35 reserved positions round up to 256, then
    // the eager chunk of 5 still fits.
    for cache in &caches {
        let shapes: Vec<Vec<i32>> = cache.arrays().iter().map(|a| a.shape()).collect();
        assert_eq!(shapes, vec![vec![1, 2, 256, 64]; 2]);
    }
}

/// The greedy token of each position of `logits` (`[positions · VOCAB]`).
fn greedy(logits: &[f32]) -> Vec<usize> {
    logits
        .chunks(VOCAB as usize)
        .map(|row| {
            row.iter()
                .enumerate()
                .fold(
                    (0, f32::MIN),
                    |best, (i, &x)| if x > best.1 { (i, x) } else { best },
                )
                .0
        })
        .collect()
}

/// The largest logit difference between the eager and the compiled steps of
/// a cache holding ggml blocks (see the test below).
const MAX_FLIP_DIFF: f32 = 5e-3;

#[test]
fn compressed_caches_step_compiled_as_they_step_eagerly() {
    let q = |bits, group_size| KvFormat::Quantized { bits, group_size };
    let t = |bits| KvFormat::Turbo { bits };
    let b = KvFormat::Block;
    let f = KvFormat::Float(None);
    // (name, head size, format, tokens kept in floats first)
    let cases = [
        (
            "ggml q8_0/q4_0",
            64,
            CacheFormat {
                keys: b(GgufDtype::Q8_0),
                values: b(GgufDtype::Q4_0),
                ..CacheFormat::COMPUTE
            },
            0,
        ),
        (
            "ggml q5_1/turbo3 after 2 float tokens",
            128,
            CacheFormat {
                keys: b(GgufDtype::Q5_1),
                values: t(3),
                ..CacheFormat::COMPUTE
            },
            2,
        ),
        (
            "float/ggml q4_1",
            64,
            CacheFormat {
                keys: f,
                values: b(GgufDtype::Q4_1),
                ..CacheFormat::COMPUTE
            },
            0,
        ),
        (
            "q8_0/q8_0",
            64,
            CacheFormat {
                keys: q(8, 64),
                values: q(8, 64),
                ..CacheFormat::COMPUTE
            },
            0,
        ),
        (
            "q4/float, group 32",
            64,
            CacheFormat {
                keys: q(4, 32),
                values: f,
                ..CacheFormat::COMPUTE
            },
            0,
        ),
        (
            "q3/q6 after 3 float tokens",
            64,
            CacheFormat {
                keys: q(3, 64),
                values: q(6, 64),
                ..CacheFormat::COMPUTE
            },
            3,
        ),
        (
            "turbo4/turbo4",
            128,
            CacheFormat {
                keys: t(4),
                values: t(4),
                ..CacheFormat::COMPUTE
            },
            0,
        ),
        (
            "q8_0/turbo3",
            128,
            CacheFormat {
                keys: q(8, 64),
                values: t(3),
                ..CacheFormat::COMPUTE
            },
            0,
        ),
        (
            "turbo2/float after 5",
            128,
            CacheFormat {
                keys: t(2),
                values: f,
                ..CacheFormat::COMPUTE
            },
            5,
        ),
    ];
    for window in [8, 300] {
        for (name, head_dim, format, start) in cases {
            let model = tiny_model_with_heads(window, head_dim);
            let (reference, _) = scheduled(&model, format, start, Steps::Eager);
            let (compiled, caches) =
                scheduled(&model, format, start, Steps::Fixed { compiled: true });
            let d = max_diff(&reference, &compiled);
            println!("window {window}, {name}: max |Δ logit| {d:e}");
            // The fixed step attends over the whole buffer under a mask, the
            // eager one over the positions held, so activations differ in
            // their last bits; a key or value that lands on the other side
            // of a rounding decision is stored one level apart, and ggml's
            // coarser levels move the logits by up to a few thousandths
            // (MAX_FLIP_DIFF; a q8_0 key at window 8 once flipped one byte
            // of layer 3 at its second step, 1e-5, while the stored blocks
            // ended identical).
            let blocks = |f: KvFormat| matches!(f, KvFormat::Block(_));
            let bound = if blocks(format.keys) || blocks(format.values) {
                MAX_FLIP_DIFF
            } else {
                1e-4
            };
            assert!(d < bound, "window {window}, {name}: {d}");
            assert_eq!(
                greedy(&reference),
                greedy(&compiled),
                "window {window}, {name}"
            );
            // The buffers stayed in their format: 1 float array, 3 affine
            // ones (packed, scales, biases), 2 TurboQuant ones or 1 of ggml
            // blocks per side.
            let arrays = |f: KvFormat| match f {
                KvFormat::Float(_) | KvFormat::Block(_) => 1,
                KvFormat::Quantized { .. } => 3,
                KvFormat::Turbo { .. } => 2,
            };
            let per_cache = arrays(format.keys) + arrays(format.values);
            assert!(
                caches.iter().all(|c| c.arrays().len() == per_cache),
                "{name}"
            );
            assert!(caches.iter().all(|c| c.offset() == TOKENS as i32));
        }
    }
}

#[test]
fn caches_whose_format_changes_are_not_reserved() {
    let model = tiny_model(8);
    let step = DecodeStep::new(&model, true).expect("decode step");
    let q8 = KvFormat::Quantized {
        bits: 8,
        group_size: 64,
    };
    let format = CacheFormat {
        keys: KvFormat::Float(None),
        values: q8,
        ..CacheFormat::COMPUTE
    };
    let mut caches = model.make_caches(format).expect("caches");
    assert!(step.reserve(&mut caches, 10).expect("reserve"));

    // Kept in floats for the first 20 tokens: reservable up to there only.
    let later = |caches: Vec<LayerCache>| -> Vec<LayerCache> {
        caches.into_iter().map(|c| c.quantize_from(20)).collect()
    };
    let mut caches = later(model.make_caches(format).expect("caches"));
    assert!(step.reserve(&mut caches, 20).expect("reserve"));
    let mut caches = later(model.make_caches(format).expect("caches"));
    assert!(!step.reserve(&mut caches, 21).expect("reserve"));
}

#[test]
fn unreserved_caches_are_refused_with_a_clear_error() {
    let model = tiny_model(8);
    let step = DecodeStep::new(&model, true).expect("decode step");
    let mut caches = model.make_caches(CacheFormat::COMPUTE).expect("caches");
    let err = step
        .forward(&tokens(&[1]), &mut caches)
        .expect_err("no buffers reserved");
    assert!(
        err.to_string()
            .contains("not reserved for fixed-shape steps"),
        "{err}"
    );
    let mut short = model.make_caches(CacheFormat::COMPUTE).expect("caches");
    let err = step
        .forward(&tokens(&[1]), &mut short[..2])
        .expect_err("too few caches");
    assert!(
        err.to_string().contains("2 caches given for 4 layers"),
        "{err}"
    );
}
