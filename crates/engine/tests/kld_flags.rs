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
fn bos_starts_every_chunk_unless_told_otherwise() {
    let args = [
        "--corpus", CORPUS, "--cand", Q8, "--ctx", "64", "--chunks", "2",
    ];
    let with = |flag: Option<&str>| {
        let mut a = args.to_vec();
        a.extend(flag);
        report("kld", &a)
    };
    let (default, bos, plain) = (with(None), with(Some("--bos")), with(Some("--no-bos")));
    assert_eq!(default["settings"]["bos"], true);
    assert_eq!(plain["settings"]["bos"], false);
    assert_eq!(
        plain["settings"]["convention"],
        "chunks start mid-text, no <bos> (REFRACT's MLX backend's)"
    );
    assert_eq!(
        default["candidates"], bos["candidates"],
        "--bos is the default"
    );
    let ppl = |r: &serde_json::Value| num(candidate(r, 0), "ppl_ref");
    assert_eq!(
        num(candidate(&default, 0), "positions"),
        num(candidate(&plain, 0), "positions")
    );
    // Gemma 3 was trained with <bos> at a sequence's start: the reference
    // predicts the same text better when each chunk starts with it.
    eprintln!(
        "reference perplexity: {:.3} with <bos>, {:.3} without",
        ppl(&default),
        ppl(&plain)
    );
    assert!(ppl(&default) < ppl(&plain));
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
