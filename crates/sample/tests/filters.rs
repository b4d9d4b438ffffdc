//! The filters on hand-made distributions: which tokens survive, and that
//! survivors keep their exact log-probabilities; and the range checks of the
//! public filter and processor functions.

mod common;

use common::row;
use mlx_core::Array;
use sample::filters::{apply_min_p, apply_top_k, apply_top_p, apply_xtc};
use sample::processors::{
    apply_frequency_penalty, apply_presence_penalty, apply_repetition_penalty,
};
use sample::SampleError;

/// The indices of the tokens `filtered` keeps; checks each kept value equals
/// the input and each removed one is `-inf`.
/// The natural logarithms of `probs`, as a `[1, n]` row of log-probabilities.
fn log_row(probs: &[f32]) -> Array {
    row(&probs.iter().map(|p| p.ln()).collect::<Vec<_>>())
}

fn kept(input: &[f32], filtered: &Array) -> Vec<usize> {
    let output = filtered.to_vec::<f32>().unwrap();
    let logprobs: Vec<f32> = input.iter().map(|p| p.ln()).collect();
    assert_eq!(output.len(), logprobs.len());
    let mut kept = Vec::new();
    for (i, (&out, &inp)) in output.iter().zip(&logprobs).enumerate() {
        if out == f32::NEG_INFINITY {
            continue;
        }
        assert_eq!(
            out, inp,
            "token {i}: a kept log-probability must be unchanged"
        );
        kept.push(i);
    }
    kept
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_the_mass() {
    let probs = [0.5, 0.3, 0.15, 0.05];
    // Ascending: 0.05, 0.15, 0.3, 0.5; mass strictly above each: 0.95, 0.8, 0.5, 0.
    // top_p 0.9 drops only 0.05 (0.95 >= 0.9), so {0, 1, 2} remain.
    assert_eq!(
        kept(&probs, &apply_top_p(&log_row(&probs), 0.9).unwrap()),
        vec![0, 1, 2]
    );
    // top_p 0.75 also drops 0.15 (0.8 >= 0.75).
    assert_eq!(
        kept(&probs, &apply_top_p(&log_row(&probs), 0.75).unwrap()),
        vec![0, 1]
    );
    // top_p 0.45: the top token alone (0.5) reaches it.
    assert_eq!(
        kept(&probs, &apply_top_p(&log_row(&probs), 0.45).unwrap()),
        vec![0]
    );
}

#[test]
fn top_p_works_on_unsorted_rows() {
    let probs = [0.05, 0.5, 0.15, 0.3];
    assert_eq!(
        kept(&probs, &apply_top_p(&log_row(&probs), 0.9).unwrap()),
        vec![1, 2, 3]
    );
}

#[test]
fn top_p_keeps_ties_with_the_least_likely_kept_token() {
    // Ascending: 0.2, 0.2, 0.2, 0.4; mass above: 0.8, 0.6, 0.4, 0. With top_p 0.5
    // two positions drop, the threshold is 0.2, and every token ties with it.
    let probs = [0.4, 0.2, 0.2, 0.2];
    assert_eq!(
        kept(&probs, &apply_top_p(&log_row(&probs), 0.5).unwrap()),
        vec![0, 1, 2, 3]
    );
}

#[test]
fn top_k_keeps_the_k_largest() {
    let probs = [0.1, 0.4, 0.2, 0.3];
    assert_eq!(
        kept(&probs, &apply_top_k(&log_row(&probs), 2).unwrap()),
        vec![1, 3]
    );
    assert_eq!(
        kept(&probs, &apply_top_k(&log_row(&probs), 1).unwrap()),
        vec![1]
    );
    assert_eq!(
        kept(&probs, &apply_top_k(&log_row(&probs), 3).unwrap()),
        vec![1, 2, 3]
    );
}

#[test]
fn top_k_of_at_least_the_vocabulary_keeps_everything() {
    let probs = [0.1, 0.4, 0.2, 0.3];
    assert_eq!(
        kept(&probs, &apply_top_k(&log_row(&probs), 4).unwrap()),
        vec![0, 1, 2, 3]
    );
    assert_eq!(
        kept(&probs, &apply_top_k(&log_row(&probs), 1000).unwrap()),
        vec![0, 1, 2, 3]
    );
}

#[test]
fn min_p_keeps_tokens_above_the_scaled_floor() {
    // min_p 0.2 with a top probability of 0.5: the floor is 0.1.
    let probs = [0.5, 0.2, 0.12, 0.09, 0.05, 0.04];
    assert_eq!(
        kept(&probs, &apply_min_p(&log_row(&probs), 0.2, 1).unwrap()),
        vec![0, 1, 2]
    );
    // Unsorted: the same tokens, wherever they sit.
    let shuffled = [0.09, 0.12, 0.04, 0.5, 0.05, 0.2];
    assert_eq!(
        kept(
            &shuffled,
            &apply_min_p(&log_row(&shuffled), 0.2, 1).unwrap()
        ),
        vec![1, 3, 5]
    );
    // min_p 1: only the top token.
    assert_eq!(
        kept(&probs, &apply_min_p(&log_row(&probs), 1.0, 1).unwrap()),
        vec![0]
    );
}

#[test]
fn min_tokens_to_keep_overrides_min_p() {
    let probs = [0.5, 0.2, 0.12, 0.09, 0.05, 0.04];
    // Three tokens pass anyway; keeping at least 2 changes nothing.
    assert_eq!(
        kept(&probs, &apply_min_p(&log_row(&probs), 0.2, 2).unwrap()),
        vec![0, 1, 2]
    );
    // Keeping 4 saves the fourth most likely (0.09).
    assert_eq!(
        kept(&probs, &apply_min_p(&log_row(&probs), 0.2, 4).unwrap()),
        vec![0, 1, 2, 3]
    );
    // With min_p 1 only the top token passes; keeping 2 saves 0.2 too.
    assert_eq!(
        kept(&probs, &apply_min_p(&log_row(&probs), 1.0, 2).unwrap()),
        vec![0, 1]
    );
    // More than the vocabulary: everything stays.
    assert_eq!(
        kept(&probs, &apply_min_p(&log_row(&probs), 0.2, 10).unwrap()),
        vec![0, 1, 2, 3, 4, 5]
    );
}

#[test]
fn filters_compose_when_chained() {
    let probs = [0.35, 0.25, 0.2, 0.1, 0.06, 0.04];
    // top_p 0.9 keeps {0,1,2,3}; min_p 0.3 (floor 0.105) then drops 0.1; top_k 2 keeps {0,1}.
    let after_top_p = apply_top_p(&log_row(&probs), 0.9).unwrap();
    assert_eq!(kept(&probs, &after_top_p), vec![0, 1, 2, 3]);
    let after_min_p = apply_min_p(&after_top_p, 0.3, 1).unwrap();
    assert_eq!(kept(&probs, &after_min_p), vec![0, 1, 2]);
    let after_top_k = apply_top_k(&after_min_p, 2).unwrap();
    assert_eq!(kept(&probs, &after_top_k), vec![0, 1]);
}

#[test]
fn out_of_range_settings_are_errors() {
    let logprobs = log_row(&[0.5, 0.3, 0.2]);
    let field = |result: Result<Array, SampleError>| match result {
        Err(SampleError::InvalidSetting { field, .. }) => field,
        other => panic!("expected InvalidSetting, got {other:?}"),
    };
    assert_eq!(field(apply_top_p(&logprobs, 0.0)), "top_p");
    assert_eq!(field(apply_top_p(&logprobs, f32::NAN)), "top_p");
    assert_eq!(field(apply_top_k(&logprobs, 0)), "top_k");
    assert_eq!(field(apply_min_p(&logprobs, 1.5, 1)), "min_p");
    assert_eq!(field(apply_min_p(&logprobs, 0.2, 0)), "min_tokens_to_keep");
    let window = Array::from_slice(&[0u32], &[1]).unwrap();
    assert_eq!(
        field(apply_repetition_penalty(&logprobs, &window, 0.0)),
        "repetition_penalty"
    );
    assert_eq!(
        field(apply_presence_penalty(&logprobs, &window, f32::NAN)),
        "presence_penalty"
    );
    assert_eq!(
        field(apply_frequency_penalty(&logprobs, &window, f32::INFINITY)),
        "frequency_penalty"
    );
}

#[test]
fn rows_of_the_wrong_shape_are_errors() {
    let flat = Array::from_slice(&[0.5f32.ln(), 0.5f32.ln()], &[2]).unwrap();
    let empty = Array::from_slice::<f32>(&[], &[1, 0]).unwrap();
    for bad in [&flat, &empty] {
        assert!(matches!(
            apply_top_p(bad, 0.9),
            Err(SampleError::BadLogits { .. })
        ));
        assert!(matches!(
            apply_min_p(bad, 0.1, 1),
            Err(SampleError::BadLogits { .. })
        ));
        assert!(matches!(
            apply_top_k(bad, 1),
            Err(SampleError::BadLogits { .. })
        ));
    }
}

#[test]
fn xtc_removes_every_likely_token_but_the_least_likely_of_them() {
    // Above 0.1: 0.5, 0.3 and 0.15; all but the least likely (0.15) go.
    let probs = [0.05, 0.5, 0.15, 0.3];
    let out = |threshold, special: &[u32]| {
        kept(
            &probs,
            &apply_xtc(&log_row(&probs), threshold, special).unwrap(),
        )
    };
    assert_eq!(out(0.1, &[]), vec![0, 2]);
    // A special token stays; the others above the threshold still go.
    assert_eq!(out(0.1, &[1]), vec![0, 1, 2]);
    // Above 0.2: 0.5 and 0.3; 0.5 goes.
    assert_eq!(out(0.2, &[]), vec![0, 2, 3]);
    // Above 0.4: 0.5 alone, which is then the least likely of them: kept.
    assert_eq!(out(0.4, &[]), vec![0, 1, 2, 3]);
    // Unnormalized logits (shifted log-probabilities) give the same.
    let shifted: Vec<f32> = probs.iter().map(|p| p.ln() + 3.0).collect();
    let removed = apply_xtc(&row(&shifted), 0.1, &[])
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let gone: Vec<bool> = removed.iter().map(|v| *v == f32::NEG_INFINITY).collect();
    assert_eq!(gone, vec![false, true, false, true]);
}

#[test]
fn xtc_checks_its_threshold_and_special_tokens() {
    let logits = log_row(&[0.5, 0.5]);
    assert!(matches!(
        apply_xtc(&logits, 0.6, &[]),
        Err(SampleError::InvalidSetting {
            field: "xtc_threshold",
            ..
        })
    ));
    let err = apply_xtc(&logits, 0.1, &[2]).unwrap_err();
    assert!(
        matches!(err, SampleError::XtcTokenOutOfVocab { token: 2, vocab: 2 }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "sampler setting `xtc_special_tokens` names token 2, outside the vocabulary of 2 tokens"
    );
}
