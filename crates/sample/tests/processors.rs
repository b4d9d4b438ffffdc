//! The logits processors through `Sampler::process_logits`, against values
//! worked out by hand from mlx-lm's definitions.

mod common;

use common::row;
use mlx_core::{Array, Dtype};
use sample::{SampleError, Sampler, SamplerConfig};

const LOGITS: [f32; 6] = [2.0, -1.0, 3.0, -4.0, 0.5, 1.5];
/// With a window of 4 the recent tokens are [0, 1, 0, 3]: token 0 twice,
/// tokens 1 and 3 once; tokens 2 and 4 are older, token 5 never appears.
const HISTORY: [i32; 6] = [2, 4, 0, 1, 0, 3];

fn history() -> Array {
    Array::from_slice(&HISTORY, &[6]).unwrap()
}

fn processed(config: SamplerConfig, history: Option<&Array>) -> Vec<f32> {
    let sampler = Sampler::new(config).unwrap();
    let logits = sampler.process_logits(&row(&LOGITS), history).unwrap();
    logits.to_vec::<f32>().unwrap()
}

fn windowed(config: SamplerConfig) -> SamplerConfig {
    SamplerConfig {
        repetition_window: 4,
        presence_window: 4,
        frequency_window: 4,
        ..config
    }
}

#[test]
fn repetition_penalty_halves_positive_and_doubles_negative_recent_logits() {
    let config = windowed(SamplerConfig {
        repetition_penalty: Some(2.0),
        ..Default::default()
    });
    // 0: 2 → 1 (once, though it appears twice); 1: -1 → -2; 3: -4 → -8; 2, 4, 5 untouched.
    assert_eq!(
        processed(config, Some(&history())),
        vec![1.0, -2.0, 3.0, -8.0, 0.5, 1.5]
    );
}

#[test]
fn presence_penalty_subtracts_once_per_distinct_recent_token() {
    let config = windowed(SamplerConfig {
        presence_penalty: Some(0.5),
        ..Default::default()
    });
    assert_eq!(
        processed(config, Some(&history())),
        vec![1.5, -1.5, 3.0, -4.5, 0.5, 1.5]
    );
}

#[test]
fn frequency_penalty_subtracts_once_per_occurrence() {
    let config = windowed(SamplerConfig {
        frequency_penalty: Some(0.5),
        ..Default::default()
    });
    // Token 0 occurs twice in the window: 2 - 2 × 0.5 = 1.
    assert_eq!(
        processed(config, Some(&history())),
        vec![1.0, -1.5, 3.0, -4.5, 0.5, 1.5]
    );
}

#[test]
fn negative_presence_and_frequency_penalties_favour_repeats() {
    let config = windowed(SamplerConfig {
        presence_penalty: Some(-1.0),
        frequency_penalty: Some(-0.5),
        ..Default::default()
    });
    // 0: 2 + 1 + 2 × 0.5 = 4; 1: -1 + 1 + 0.5 = 0.5; 3: -4 + 1 + 0.5 = -2.5.
    assert_eq!(
        processed(config, Some(&history())),
        vec![4.0, 0.5, 3.0, -2.5, 0.5, 1.5]
    );
}

#[test]
fn the_window_defaults_to_20_tokens() {
    let config = SamplerConfig {
        presence_penalty: Some(1.0),
        ..Default::default()
    };
    assert_eq!(config.presence_window, 20);
    // 24 ids: the first four (token 5) are outside the window, the last 20 (token 2) inside.
    let ids: Vec<u32> = [5; 4].into_iter().chain([2; 20]).collect();
    let history = Array::from_slice(&ids, &[24]).unwrap();
    assert_eq!(
        processed(config, Some(&history)),
        vec![2.0, -1.0, 2.0, -4.0, 0.5, 1.5]
    );
}

#[test]
fn each_penalty_looks_at_its_own_window() {
    // Repetition over the last 2 ids [0, 3], presence over the last 4
    // [0, 1, 0, 3], frequency over all 6 [2, 4, 0, 1, 0, 3].
    let config = SamplerConfig {
        repetition_penalty: Some(2.0),
        repetition_window: 2,
        presence_penalty: Some(0.5),
        presence_window: 4,
        frequency_penalty: Some(0.25),
        frequency_window: 6,
        ..Default::default()
    };
    assert_eq!(config.history_window(), 6);
    // 0: 2 / 2 - 0.5 - 2 × 0.25 = 0; 1: -1 - 0.5 - 0.25 = -1.75;
    // 2: 3 - 0.25 = 2.75; 3: -4 × 2 - 0.5 - 0.25 = -8.75; 4: 0.5 - 0.25 = 0.25.
    assert_eq!(
        processed(config, Some(&history())),
        vec![0.0, -1.75, 2.75, -8.75, 0.25, 1.5]
    );
    let without_penalties = SamplerConfig {
        repetition_window: 50,
        ..Default::default()
    };
    assert_eq!(without_penalties.history_window(), 0);
}

#[test]
fn logit_bias_adds_and_sums_repeated_ids() {
    let config = SamplerConfig {
        logit_bias: vec![(1, 1.0), (5, -0.5), (1, 0.25), (4, f32::NEG_INFINITY)],
        ..Default::default()
    };
    assert_eq!(
        processed(config, None),
        vec![2.0, 0.25, 3.0, -4.0, f32::NEG_INFINITY, 1.0]
    );
}

#[test]
fn the_bias_pairs_are_merged_and_a_plain_greedy_pick_is_told_apart() {
    let config = SamplerConfig {
        logit_bias: vec![(5, -0.5), (1, 1.0), (1, 0.25)],
        ..Default::default()
    };
    let greedy = Sampler::new(config.clone()).unwrap();
    assert_eq!(greedy.logit_bias_pairs(), &[(1, 1.25), (5, -0.5)]);
    assert!(greedy.picks_biased_argmax());
    let penalised = Sampler::new(SamplerConfig {
        repetition_penalty: Some(1.1),
        ..config.clone()
    })
    .unwrap();
    assert!(!penalised.picks_biased_argmax());
    let sampled = Sampler::new(SamplerConfig {
        temperature: 0.7,
        ..config
    })
    .unwrap();
    assert!(!sampled.picks_biased_argmax());
    assert!(Sampler::new(SamplerConfig::default())
        .unwrap()
        .logit_bias_pairs()
        .is_empty());
}

#[test]
fn processors_apply_bias_then_repetition_then_presence_then_frequency() {
    let config = windowed(SamplerConfig {
        logit_bias: vec![(1, 1.0)],
        repetition_penalty: Some(2.0),
        presence_penalty: Some(0.5),
        frequency_penalty: Some(0.25),
        ..Default::default()
    });
    // Token 0: 2 → 1 (repetition) → 0.5 (presence) → 0 (two occurrences × 0.25).
    // Token 1: -1 → 0 (bias) → 0 (0 / 2) → -0.5 → -0.75.
    // Token 3: -4 → -8 → -8.5 → -8.75.
    assert_eq!(
        processed(config, Some(&history())),
        vec![0.0, -0.75, 3.0, -8.75, 0.5, 1.5]
    );
}

#[test]
fn penalties_without_history_change_nothing() {
    let config = SamplerConfig {
        repetition_penalty: Some(2.0),
        frequency_penalty: Some(1.0),
        ..Default::default()
    };
    assert_eq!(processed(config.clone(), None), LOGITS.to_vec());
    let empty = Array::from_slice::<u32>(&[], &[0]).unwrap();
    assert_eq!(processed(config, Some(&empty)), LOGITS.to_vec());
}

#[test]
fn uint32_history_and_bfloat16_logits_are_accepted() {
    let config = windowed(SamplerConfig {
        repetition_penalty: Some(2.0),
        ..Default::default()
    });
    let sampler = Sampler::new(config).unwrap();
    let ids: Vec<u32> = HISTORY.iter().map(|&id| id as u32).collect();
    let history = Array::from_slice(&ids, &[6]).unwrap();
    // Every value here is exact in bfloat16.
    let logits = row(&LOGITS).astype(Dtype::Bfloat16).unwrap();
    let out = sampler.process_logits(&logits, Some(&history)).unwrap();
    assert_eq!(out.dtype(), Dtype::Float32);
    assert_eq!(
        out.to_vec::<f32>().unwrap(),
        vec![1.0, -2.0, 3.0, -8.0, 0.5, 1.5]
    );
}

#[test]
fn bad_shapes_and_dtypes_are_errors() {
    let mut sampler = Sampler::new(SamplerConfig {
        repetition_penalty: Some(2.0),
        ..Default::default()
    })
    .unwrap();
    let flat = Array::from_slice(&LOGITS, &[6]).unwrap();
    assert!(matches!(
        sampler.sample(&flat, None),
        Err(SampleError::BadLogits { .. })
    ));
    let ints = Array::from_slice(&[1i32, 2, 3], &[1, 3]).unwrap();
    assert!(matches!(
        sampler.sample(&ints, None),
        Err(SampleError::BadLogits { .. })
    ));
    let two_d = Array::from_slice(&HISTORY, &[1, 6]).unwrap();
    let err = sampler.sample(&row(&LOGITS), Some(&two_d)).unwrap_err();
    assert!(matches!(err, SampleError::BadHistory { .. }), "{err}");
    let floats = Array::from_slice(&[0.0f32, 1.0], &[2]).unwrap();
    assert!(matches!(
        sampler.sample(&row(&LOGITS), Some(&floats)),
        Err(SampleError::BadHistory { .. })
    ));
}

#[test]
fn a_bias_outside_the_vocabulary_is_an_error() {
    let mut sampler = Sampler::new(SamplerConfig {
        logit_bias: vec![(2, 1.0), (6, 1.0)],
        ..Default::default()
    })
    .unwrap();
    let err = sampler.sample(&row(&LOGITS), None).unwrap_err();
    assert!(
        matches!(err, SampleError::BiasTokenOutOfVocab { token: 6, vocab: 6 }),
        "{err}"
    );
    assert!(err.to_string().contains("logit_bias"), "{err}");
}

#[test]
fn last_tokens_keeps_the_end_of_the_history() {
    let ids = Array::from_slice(&[1i32, 2, 3, 4, 5, 6], &[6]).unwrap();
    let last = |window| {
        sample::processors::last_tokens(&ids, window)
            .unwrap()
            .to_vec::<i32>()
            .unwrap()
    };
    assert_eq!(last(3), vec![4, 5, 6]);
    assert_eq!(last(6), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(last(10), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(last(0), Vec::<i32>::new());
}
