//! `gemma-mlx kld`'s chunking flags and its trajectory axis, on the default
//! model with short chunks.

mod kld_cli;

use kld_cli::{candidate, num, report, temp_file, CORPUS};

const Q8: &str = "ctk=q8_0,ctv=q8_0";

#[test]
fn second_half_scores_only_the_positions_after_the_middle() {
    let full = report(
        "kld",
        &[
            "--corpus", CORPUS, "--cand", Q8, "--ctx", "64", "--chunks", "2",
        ],
    );
    let half = report(
        "kld",
        &[
            "--corpus",
            CORPUS,
            "--cand",
            Q8,
            "--ctx",
            "64",
            "--chunks",
            "2",
            "--second-half",
        ],
    );
    // Each chunk of 64 scores the 63 positions that have a next token inside
    // it; the second half keeps positions 32..62.
    assert_eq!(num(candidate(&full, 0), "positions"), 2.0 * 63.0);
    assert_eq!(num(candidate(&half, 0), "positions"), 2.0 * 31.0);
    assert_eq!(half["settings"]["second_half"], true);
}

#[test]
fn bos_replaces_the_first_token_of_every_chunk() {
    let plain = report(
        "kld",
        &[
            "--corpus", CORPUS, "--cand", Q8, "--ctx", "64", "--chunks", "2",
        ],
    );
    let bos = report(
        "kld",
        &[
            "--corpus", CORPUS, "--cand", Q8, "--ctx", "64", "--chunks", "2", "--bos",
        ],
    );
    assert_eq!(bos["settings"]["bos"], true);
    assert_eq!(
        num(candidate(&bos, 0), "positions"),
        num(candidate(&plain, 0), "positions")
    );
    // A different first token changes every later distribution of the chunk.
    assert_ne!(
        num(candidate(&bos, 0), "ppl_ref"),
        num(candidate(&plain, 0), "ppl_ref")
    );
}

#[test]
fn prompts_add_the_trajectory_axis_to_the_composite() {
    let (_dir, prompts) = temp_file(
        "prompts.jsonl",
        "{\"prompt\": \"The capital of France is\"}\n{\"prompt\": \"Once upon a time\"}\n",
    );
    let r = report(
        "kld",
        &[
            "--corpus",
            CORPUS,
            "--cand",
            Q8,
            "--ctx",
            "64",
            "--chunks",
            "1",
            "--prompts",
            prompts.to_str().unwrap(),
            "--max-tokens",
            "8",
        ],
    );
    let c = candidate(&r, 0);
    let (kld_score, trajectory) = (num(c, "kld_score"), num(c, "trajectory_score"));
    assert_eq!(c["trajectories"].as_array().map(Vec::len), Some(2));
    let harmonic = 2.0 / (1.0 / kld_score + 1.0 / trajectory);
    assert!((num(c, "composite") - harmonic).abs() < 1e-9, "{c}");
}
