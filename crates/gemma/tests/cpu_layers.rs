//! Single tokens through every block as operations of ours on the CPU
//! (weights on our CPU kernels): the eager forward pass (the block in three
//! operations, the cache's own store between them) and the compiled decode
//! step (one operation writing float32 buffers in place; three over
//! compressed ones) give the same bits, on every CPU kernel family this CPU
//! runs and for float, affine and TurboQuant caches. Against MLX's
//! operations reading the same tokens at once (an independent path), they
//! agree within float tolerance with float32 activations and within the
//! 8-bit path's budget with 8-bit ones. The models: the tiny random model
//! of `common::models::tiny_config` with 4-bit affine weights (windows of
//! 8, where the ring wraps several times, and 300), and the default model's
//! GGUF file as stored across its 512-token window.

mod common;

use common::fixed_steps::{eager, max_diff, scheduled, Steps, FIXED, PREFILL, VOCAB};
use common::models::{default_model_path, random_model_with, tiny_config};
use gemma::cache::{CacheFormat, KvFormat, LayerCache};
use gemma::forward::decode_step::DecodeStep;
use gemma::load::{load, Arithmetic, CpuKernels, LoadOptions, ModelSource, WeightStorage};
use gemma::model::Gemma3;
use mlx_core::block_dot::affine_rows_dot_available;
use mlx_core::{Array, Dtype};

/// The position of each row's largest value.
fn greedy(logits: &[f32], vocab: usize) -> Vec<usize> {
    logits
        .chunks(vocab)
        .map(|row| {
            row.iter()
                .enumerate()
                .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
                .0
        })
        .collect()
}

/// Cache formats the steps are compared under: float, MLX affine keys and
/// values of two widths, and TurboQuant keys with affine values.
fn formats() -> [(&'static str, CacheFormat); 3] {
    let affine = |bits| KvFormat::Quantized {
        bits,
        group_size: 64,
    };
    [
        ("float", CacheFormat::COMPUTE),
        (
            "q8_0/q4_0",
            CacheFormat {
                keys: affine(8),
                values: affine(4),
                ..CacheFormat::COMPUTE
            },
        ),
        (
            "turbo4/q8_0",
            CacheFormat {
                keys: KvFormat::Turbo { bits: 4 },
                values: affine(8),
                ..CacheFormat::COMPUTE
            },
        ),
    ]
}

#[test]
fn cpu_blocks_step_eagerly_and_compiled_to_the_same_bits() {
    for family in CpuKernels::supported().unwrap() {
        if !affine_rows_dot_available(family, 4, 64).unwrap() {
            println!("SKIPPED {family}: no affine kernel in it");
            continue;
        }
        for window in [8, 300] {
            let mut config = tiny_config(3);
            config.sliding_window = window;
            let options = LoadOptions {
                dtype: Dtype::Float32,
                quantize: Some((4, 64)),
                weights: WeightStorage::Native(Arithmetic::int8(family)),
            };
            let model = random_model_with(config, options, 23);
            assert!(model.has_cpu_layers().unwrap());
            // MLX's operations over the whole sequence at once.
            let reference = eager(&model);
            let steps = PREFILL * VOCAB as usize..(PREFILL + FIXED) * VOCAB as usize;
            let spread = max_diff(&reference[steps.clone()], &vec![0.0; steps.len()]);
            // The first format's head dimension (64) takes no TurboQuant.
            for (name, format) in formats().into_iter().take(2) {
                let (stepped, _) = scheduled(&model, format, 0, Steps::Eager);
                for compiled in [false, true] {
                    let (fixed, _) = scheduled(&model, format, 0, Steps::Fixed { compiled });
                    assert_eq!(
                        max_diff(&stepped, &fixed),
                        0.0,
                        "{family}, window {window}, {name}, compiled {compiled}"
                    );
                }
                if name == "float" {
                    let d = max_diff(&reference, &stepped);
                    println!("{family}, window {window}: max |Δ logit| {d:e} of {spread}");
                    // The steps' 8-bit activations against the float32 ones
                    // of the tokens read at once (both products on the same
                    // 4-bit weights): within 5 % of the logits' spread
                    // (which is too narrow, ±0.7, for greedy tokens to tell
                    // much; measured 2.3 % at window 8). The eager chunk
                    // after the steps reads what the blocks wrote.
                    assert!(d < 5e-2 * spread, "{family}, window {window}: {d}");
                }
            }
        }
    }
}

#[test]
fn dense_weights_keep_the_mlx_blocks() {
    let model = random_model_with(
        tiny_config(3),
        LoadOptions {
            dtype: Dtype::Float32,
            quantize: None,
            weights: WeightStorage::Dequantized,
        },
        23,
    );
    assert!(!model.has_cpu_layers().unwrap());
}

/// Logits of `ids` fed one at a time after an eager prefill of `prompt`,
/// through the eager pass or the compiled step, over caches of `format`.
fn stepped(
    model: &Gemma3,
    format: CacheFormat,
    prompt: &[i32],
    ids: &[i32],
    fixed: bool,
) -> Vec<f32> {
    let vocab = model.config.vocab_size;
    let mut caches: Vec<LayerCache> = model.make_caches(format).unwrap();
    let row = |t: &[i32]| Array::from_slice(t, &[1, t.len() as i32]).unwrap();
    let out = model.forward(&row(prompt), &mut caches).unwrap();
    let mut arrays = vec![&out];
    arrays.extend(caches.iter().flat_map(LayerCache::arrays));
    mlx_core::eval(&arrays).unwrap();
    let step = fixed.then(|| {
        let step = DecodeStep::new(model, true).unwrap();
        let end = (prompt.len() + ids.len()) as i32;
        assert!(step.reserve(&mut caches, end).unwrap());
        step
    });
    let mut logits = Vec::with_capacity(ids.len() * vocab);
    for &id in ids {
        let out = match &step {
            Some(step) => step.forward(&row(&[id]), &mut caches),
            None => model.forward(&row(&[id]), &mut caches),
        }
        .unwrap();
        logits.extend(out.to_vec::<f32>().unwrap());
    }
    logits
}

/// Logits of the last `n` of `ids` read at once after the rest (MLX's
/// operations over the matrices dequantized for the product).
fn read_at_once(model: &Gemma3, ids: &[i32], n: usize) -> Vec<f32> {
    let vocab = model.config.vocab_size;
    let mut caches: Vec<LayerCache> = model.make_caches(CacheFormat::COMPUTE).unwrap();
    let out = model
        .forward(
            &Array::from_slice(ids, &[1, ids.len() as i32]).unwrap(),
            &mut caches,
        )
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    out[out.len() - n * vocab..].to_vec()
}

#[test]
fn the_default_model_as_stored_steps_across_its_window_eagerly_and_compiled_alike() {
    let path = default_model_path();
    if !path.exists() {
        println!("SKIPPED: the default model {} is missing", path.display());
        return;
    }
    let mut arithmetics = vec![Arithmetic::f32()];
    arithmetics.extend(
        CpuKernels::supported()
            .unwrap()
            .into_iter()
            .map(Arithmetic::int8),
    );
    for arithmetic in arithmetics {
        let options = LoadOptions {
            dtype: Dtype::Float32,
            quantize: None,
            weights: WeightStorage::Native(arithmetic),
        };
        let model = load(&ModelSource::Gguf(path.clone()), options, &mut |_, _| {})
            .unwrap()
            .model;
        assert!(model.has_cpu_layers().unwrap());
        let window = model.config.sliding_window;
        // A prompt 8 short of the window, then 24 steps past it.
        let ids: Vec<i32> = (0..window as i32 + 16)
            .map(|i| 2 + (i * 7919 + 11) % 20000)
            .collect();
        let (prompt, steps) = ids.split_at(window - 8);
        let vocab = model.config.vocab_size;
        for (name, format) in formats() {
            let eager = stepped(&model, format, prompt, steps, false);
            let fixed = stepped(&model, format, prompt, steps, true);
            let d = max_diff(&eager, &fixed);
            println!("default model, {arithmetic:?}, {name}: max |Δ logit| eager/compiled {d:e}");
            assert_eq!(d, 0.0, "{arithmetic:?}, {name}");
            if name != "float" {
                continue;
            }
            let reference = read_at_once(&model, &ids, steps.len());
            let d = max_diff(&eager, &reference);
            let same = greedy(&eager, vocab)
                .iter()
                .zip(greedy(&reference, vocab))
                .filter(|(a, b)| **a == *b)
                .count();
            let kld = mean_kld(&reference, &eager, vocab);
            println!(
                "default model, {arithmetic:?}, {} steps against the tokens read at once: \
                 max |Δ logit| {d:e}, mean KLD {kld:e}, {same} greedy tokens the same",
                steps.len()
            );
            if arithmetic == Arithmetic::f32() {
                // Float32 activations: only the order of additions differs.
                assert!(d < 2e-3, "{d}");
                assert_eq!(same, steps.len());
            } else {
                // 8-bit activations against the float32 ones of the matrices
                // read at once: the 8-bit path's KLD budget.
                assert!(kld < 5e-3, "{arithmetic:?}: {kld}");
            }
        }
    }
}

/// Mean over rows of KL(softmax(p) ‖ softmax(q)).
fn mean_kld(p: &[f32], q: &[f32], vocab: usize) -> f64 {
    let log_softmax = |row: &[f32]| -> Vec<f64> {
        let max = row.iter().fold(f32::MIN, |m, &x| m.max(x)) as f64;
        let total: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
        row.iter().map(|&x| x as f64 - max - total.ln()).collect()
    };
    let rows = p.len() / vocab;
    p.chunks(vocab)
        .zip(q.chunks(vocab))
        .map(|(a, b)| {
            let (a, b) = (log_softmax(a), log_softmax(b));
            a.iter()
                .zip(&b)
                .map(|(x, y)| x.exp() * (x - y))
                .sum::<f64>()
        })
        .sum::<f64>()
        / rows as f64
}
