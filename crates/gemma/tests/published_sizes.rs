//! Every published Gemma 3 size builds and runs: the real widths with a few
//! layers (whole 4B–27B models do not fit this machine), and the 270M and 1B
//! shapes whole; weight quantization after loading stays close to float.
//! The vocabulary is cut to 8,192 rows where the test is about the layers:
//! random 262k-row embeddings of the large widths alone take gigabytes.

use gemma::cache::CacheFormat;
use gemma::config::{Gemma3Config, PUBLISHED_SIZES};
use gemma::load::{load, quantize_weights, LoadOptions, ModelSource, WeightStorage};
use gemma::model::Gemma3;
use mlx_core::{Array, Dtype};

/// Random float32 weights of `config` (seed `seed`), quantized at load as asked.
fn random_model(config: &Gemma3Config, quantize: Option<(i32, i32)>, seed: u64) -> Gemma3 {
    load(
        &ModelSource::Random {
            config: Box::new(config.clone()),
            seed,
        },
        LoadOptions {
            dtype: Dtype::Float32,
            quantize,
            weights: WeightStorage::Dequantized,
        },
        &mut |_, _| {},
    )
    .unwrap()
    .model
}

fn logits_of(config: Gemma3Config, quantize: Option<(i32, i32)>, tokens: &[i32]) -> Vec<f32> {
    let model = random_model(&config, quantize, 7);
    let mut caches = model.make_caches(CacheFormat::COMPUTE).unwrap();
    let input = Array::from_slice(tokens, &[1, tokens.len() as i32]).unwrap();
    let logits = model.forward(&input, &mut caches).unwrap();
    assert_eq!(
        logits.shape(),
        vec![1, tokens.len() as i32, model.config.vocab_size as i32]
    );
    logits.to_vec::<f32>().unwrap()
}

#[test]
fn every_published_width_runs_with_two_layers() {
    for size in PUBLISHED_SIZES {
        let mut config = Gemma3Config::published(size, Some(2)).unwrap();
        config.vocab_size = 8192;
        let (hidden, heads) = (config.hidden_size, config.num_attention_heads);
        let logits = logits_of(config, None, &[2, 100, 200, 300, 400]);
        assert!(
            logits.iter().all(|v| v.is_finite()),
            "{size}: non-finite logits"
        );
        println!("{size}: hidden {hidden}, {heads} heads: ok");
    }
}

#[test]
fn parameters_count_the_float_model_s_elements_whatever_the_storage() {
    // One key/value head (270M) and several (4B), one layer each.
    for size in ["270m", "4b"] {
        let mut config = Gemma3Config::published(size, Some(1)).unwrap();
        config.vocab_size = 1024;
        let count = |quantize| -> usize {
            let model = random_model(&config, quantize, 1);
            model.arrays().iter().map(|a| a.size()).sum()
        };
        assert_eq!(config.parameters(), count(None), "{size}");
        // Packed 4-bit weights hold fewer elements; the count stays.
        assert!(count(Some((4, 64))) < config.parameters(), "{size}");
    }
    // The published 1B model: 999,885,952 parameters.
    let one_b = Gemma3Config::published("1b", None).unwrap();
    assert_eq!(one_b.parameters(), 999_885_952);
}

#[test]
fn the_270m_and_1b_shapes_run_whole() {
    for (size, layers) in [("270m", 18), ("1b", 26)] {
        let mut config = Gemma3Config::published(size, None).unwrap();
        assert_eq!(config.num_hidden_layers, layers);
        config.vocab_size = 8192;
        let logits = logits_of(config, None, &[2, 10, 20]);
        assert!(
            logits.iter().all(|v| v.is_finite()),
            "{size}: non-finite logits"
        );
    }
}

#[test]
fn quantized_weights_stay_close_to_float_weights() {
    let config = Gemma3Config::published("270m", Some(2)).unwrap();
    let tokens = [2, 818, 5279, 529, 7001, 563];
    let float = logits_of(config.clone(), None, &tokens);
    let scale = float.iter().fold(0f32, |m, v| m.max(v.abs()));
    for bits in [8, 4] {
        let q = logits_of(config.clone(), Some((bits, 64)), &tokens);
        let max_diff = float
            .iter()
            .zip(&q)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        println!("{bits}-bit weights: max |Δlogit| {max_diff} (max |logit| {scale})");
        let bound = if bits == 8 { 0.02 } else { 0.3 };
        assert!(
            max_diff <= bound * scale,
            "{bits}-bit: {max_diff} > {bound} × {scale}"
        );
        assert!(max_diff > 0.0, "{bits}-bit weights changed nothing");
    }
}

#[test]
fn quantizing_weights_replaces_every_projection() {
    let config = Gemma3Config::published("270m", Some(1)).unwrap();
    let mut model = random_model(&config, None, 1);
    let before = model.weight_bytes();
    quantize_weights(&mut model, 4, 64).unwrap();
    let after = model.weight_bytes();
    // 4-bit packing plus float32 scales and biases per 64 values: 4/32 + 2·4/(64·4) of float32.
    let expected_ratio = 4.0 / 32.0 + 2.0 / 64.0;
    let ratio = after as f64 / before as f64;
    println!("weights {before} → {after} bytes ({ratio:.4})");
    assert!(ratio < expected_ratio + 0.01, "ratio {ratio}");
}

#[test]
fn every_weight_is_made_when_the_model_loads() {
    // The fused Q/K/V and gate/up projections are concatenations and the
    // norms' weights are 1 + w: left lazy, the last layer's gate/up and
    // norms (which no prompt cache needs) would be traced into a compiled
    // decode step and made again at every step.
    let config = Gemma3Config::published("270m", Some(2)).unwrap();
    for quantize in [None, Some((4, 64))] {
        let model = random_model(&config, quantize, 3);
        let lazy = model.arrays().iter().filter(|a| !a.is_evaluated()).count();
        assert_eq!(
            lazy, 0,
            "{lazy} weight arrays left unevaluated ({quantize:?})"
        );
    }
}
