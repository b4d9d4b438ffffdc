//! `gemma-mlx trajectory` on the default model: greedy ids under the
//! reference cache and under each candidate, and the trajectory score.

mod kld_cli;

use kld_cli::{gemma_mlx, model, num, report, stderr, temp_file};
use serde_json::Value;

const PROMPTS: &str = r#"{"prompt": "The capital of France is"}
{"prompt": "Once upon a time, in a small village by the sea,"}
{"prompt": "The three primary colours are"}
"#;

const MAX_TOKENS: usize = 32;

fn agreements(c: &Value) -> &Vec<Value> {
    c["trajectories"]
        .as_array()
        .unwrap_or_else(|| panic!("no trajectories in {c}"))
}

#[test]
fn trajectory_scores_fall_with_fewer_bits() {
    let (_dir, prompts) = temp_file("prompts.jsonl", PROMPTS);
    let prompts = prompts.display().to_string();
    let max = MAX_TOKENS.to_string();
    let r = report(
        "trajectory",
        &[
            "--prompts",
            &prompts,
            "--ref",
            "",
            "--cand",
            "ctk=q8_0,ctv=q8_0",
            "--cand",
            "ctk=mlx2,ctv=mlx2",
            "--cand",
            "ctk=f32,ctv=f32",
            "--max-tokens",
            &max,
        ],
    );
    // The settings name the prompts file and carry no corpus chunking.
    assert_eq!(r["settings"]["corpus"], prompts.as_str());
    for field in ["ctx", "chunks", "forwards", "reference_kv_cache_bytes"] {
        assert!(
            r["settings"].get(field).is_none(),
            "{field} in {}",
            r["settings"]
        );
    }
    let candidates = r["candidates"].as_array().expect("candidates");
    assert_eq!(candidates.len(), 3);
    let reference_lengths: Vec<&Value> = agreements(&candidates[0])
        .iter()
        .map(|a| &a["reference_tokens"])
        .collect();
    for c in candidates {
        let per_prompt = agreements(c);
        assert_eq!(per_prompt.len(), 3, "{c}");
        let (mut common, mut longest) = (0.0, 0.0);
        for (a, reference_tokens) in per_prompt.iter().zip(&reference_lengths) {
            // Every candidate is compared with the same reference run.
            assert_eq!(&a["reference_tokens"], *reference_tokens, "{c}");
            let (r, k, p) = (
                num(a, "reference_tokens"),
                num(a, "candidate_tokens"),
                num(a, "common_prefix"),
            );
            assert!(
                r >= 1.0 && r <= MAX_TOKENS as f64 && k <= MAX_TOKENS as f64,
                "{a}"
            );
            assert!(p <= r.min(k), "{a}");
            if p < r.max(k) {
                assert_eq!(a["first_divergence"], a["common_prefix"], "{a}");
            } else {
                assert!(a["first_divergence"].is_null(), "{a}");
            }
            common += p;
            longest += r.max(k);
        }
        let score = num(c, "trajectory_score");
        assert!((score - 100.0 * common / longest).abs() < 1e-9, "{c}");
        assert_eq!(num(c, "composite"), score, "{c}");
        eprintln!("{}: trajectory score {score:.2}", c["canonical"]);
    }
    // f32 keys and values are the float32 reference's own format.
    let identical = &candidates[2];
    assert_eq!(num(identical, "trajectory_score"), 100.0);
    assert!(agreements(identical)
        .iter()
        .all(|a| a["first_divergence"].is_null()));
    let (q8, q2) = (
        num(&candidates[0], "trajectory_score"),
        num(&candidates[1], "trajectory_score"),
    );
    assert!(q2 < q8, "q2 {q2} should score below q8 {q8}");
}

#[test]
fn trajectory_without_candidates_says_so() {
    let (_dir, prompts) = temp_file("prompts.jsonl", PROMPTS);
    let prompts = prompts.display().to_string();
    let model = model();
    let out = gemma_mlx(&["trajectory", "--model", &model, "--prompts", &prompts]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no candidates"), "{}", stderr(&out));
}
