//! Numerical parity of the forward pass with mlx-lm 0.32.2 on the default
//! model (Gemma 3 270M, `<workspace>/target/model/gemma-3-270m-q4_k_m.gguf`
//! or `GEMMA_MLX_MODEL`), dequantized to float32, on real English text
//! (`tests/fixtures/text/`).
//!
//! The model is converted once into a Hugging Face folder that mlx-lm loads
//! (kept in `<workspace>/target/parity/default-model` and converted again
//! when the GGUF file or this test binary changes). The tests need the
//! mlx-lm venv (`cargo xtask setup`, or `GEMMA_MLX_PYTHON`); without it they
//! fail, unless `GEMMA_MLX_SKIP_PARITY=1`, which skips them.

mod common;

use std::path::PathBuf;

use common::diff::{max_abs_diff, step_of};
use common::mlx_lm::{python, CacheSpec, Reference, Run};
use common::models::{corpus_text, with_default_model, DefaultModel};
use common::{chunks, ours};
use gemma::cache::CacheFormat;

/// The largest |Δlogit| accepted.
const TOLERANCE: f32 = 1e-3;

fn reference(python: PathBuf, model: &DefaultModel) -> Reference {
    Reference {
        python,
        model_dir: model.hf_dir.clone().expect("the converted folder"),
    }
}

/// `<bos>` and then the corpus's tokens from `start`, `n` tokens in all.
fn text_ids(model: &DefaultModel, start: usize, n: usize) -> Vec<u32> {
    let corpus = model
        .tokenizer
        .encode_plain(&corpus_text())
        .expect("tokenize the corpus");
    assert!(
        corpus.len() >= start + n - 1,
        "the corpus has {} tokens, {} needed",
        corpus.len(),
        start + n - 1
    );
    let mut ids = vec![model.model.config.bos_token_id];
    ids.extend_from_slice(&corpus[start..start + n - 1]);
    ids
}

/// Runs `schedule` (chunk sizes over `ids`) on both sides with the model's
/// float caches and checks every position's logits.
fn check_schedule(python: PathBuf, model: &DefaultModel, ids: &[u32], schedule: &[usize]) {
    let chunks = chunks(ids, schedule);
    let (expected, vocab) = reference(python, model)
        .run(&[Run::Logits {
            cache: CacheSpec::Model,
            chunks: chunks.clone(),
        }])
        .remove(0)
        .into_logits();
    let actual = ours::logits(&model.model, CacheFormat::COMPUTE, &chunks);
    let diff = max_abs_diff(&actual, &expected, vocab);
    let (step, index) = step_of(diff.position, &chunks);
    println!(
        "{} calls: {diff} (call {step}, a chunk of {}, index {index})",
        chunks.len(),
        chunks[step].len()
    );
    assert!(
        diff.value <= TOLERANCE,
        "{diff} exceeds {TOLERANCE} (call {step}, index {index})"
    );
}

/// 600 tokens in one call: the sliding layers' 512-token window binds.
#[test]
fn prefill_of_600_text_tokens_matches_mlx_lm() {
    let Some(python) = python() else { return };
    with_default_model(true, |model| {
        let ids = text_ids(model, 0, 600);
        check_schedule(python, model, &ids, &[600]);
    });
}

/// 500 tokens, then 30 single tokens (the sliding caches fill and wrap),
/// then a chunk of 40 after the wrap.
#[test]
fn decoding_past_the_window_matches_mlx_lm() {
    let Some(python) = python() else { return };
    with_default_model(true, |model| {
        let ids = text_ids(model, 600, 570);
        let schedule = [vec![500], vec![1; 30], vec![40]].concat();
        check_schedule(python, model, &ids, &schedule);
    });
}

/// 64 greedy tokens after each of four prompts (raw text after `<bos>`).
#[test]
fn greedy_continuations_match_mlx_lm() {
    let Some(python) = python() else { return };
    const PROMPTS: [&str; 4] = [
        "The lighthouse keeper climbed the stairs",
        "To bake a good loaf of bread, you need",
        "The river flooded the valley every spring, and",
        "Before the invention of the pendulum clock,",
    ];
    with_default_model(true, |model| {
        let prompts: Vec<Vec<u32>> = PROMPTS
            .iter()
            .map(|p| model.tokenizer.encode(p, true).expect("tokenize"))
            .collect();
        let runs: Vec<Run> = prompts
            .iter()
            .map(|p| Run::Greedy {
                cache: CacheSpec::Model,
                prompt: p.clone(),
                max_tokens: 64,
            })
            .collect();
        let expected = reference(python, model).run(&runs);
        for ((text, prompt), theirs) in PROMPTS.iter().zip(&prompts).zip(expected) {
            let theirs = theirs.into_tokens();
            let ours = ours::greedy(&model.model, CacheFormat::COMPUTE, prompt, 64);
            let decoded = model.tokenizer.decode(&ours.tokens).unwrap_or_default();
            if let Some(i) = ours.tokens.iter().zip(&theirs).position(|(a, b)| a != b) {
                panic!(
                    "{text:?}: greedy step {i} gives {} here, {} in mlx-lm (our top logit \
                     leads by {:.2e})\nours:   {:?}\nmlx-lm: {theirs:?}\nour text: {decoded:?}",
                    ours.tokens[i], theirs[i], ours.margins[i], ours.tokens
                );
            }
            assert_eq!(ours.tokens, theirs);
            let closest = ours.margins.iter().copied().fold(f32::INFINITY, f32::min);
            println!("{text:?} → {decoded:?} (identical; closest top-2 margin {closest:.2e})");
        }
    });
}
