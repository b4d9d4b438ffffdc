//! Running `gemma-mlx kld` and `gemma-mlx trajectory` on the default model
//! and reading their JSON reports.

// Each test file uses a different part of these helpers (and of the
// re-exported ones).
#![allow(dead_code, unused_imports)]

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

#[path = "../common/mod.rs"]
mod common;

pub use common::{json_of, stderr};

/// The shipped corpus: real prose, 4,181 tokens (our tokenizer and the
/// converted folder's `tokenizer.json` under transformers give the same ids).
pub const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../gemma/tests/fixtures/text/essays.txt"
);

/// The default model's file, as a command-line argument.
pub fn model() -> String {
    common::default_model_path().display().to_string()
}

/// Runs `gemma-mlx` with `args` (stdin empty).
pub fn gemma_mlx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gemma-mlx"))
        .args(args)
        .output()
        .expect("gemma-mlx runs")
}

/// Runs `gemma-mlx SUBCOMMAND --model <default> --dtype float32 --weights
/// dequantized --json ARGS…` (mlx-lm's float32 model, which the fixtures
/// come from) and returns the JSON object on stdout's last line; panics
/// with stderr on failure.
pub fn report(subcommand: &str, args: &[&str]) -> Value {
    let model = model();
    let mut all = vec![
        subcommand,
        "--model",
        &model,
        "--dtype",
        "float32",
        "--weights",
        "dequantized",
        "--json",
    ];
    all.extend_from_slice(args);
    json_of(&gemma_mlx(&all))
}

/// `report["candidates"][i]`.
pub fn candidate(report: &Value, i: usize) -> &Value {
    &report["candidates"][i]
}

/// A number field of a JSON object; panics naming the field when absent.
pub fn num(v: &Value, field: &str) -> f64 {
    v[field]
        .as_f64()
        .unwrap_or_else(|| panic!("'{field}' is not a number in {v}"))
}

/// The candidate with canonical form `canonical`.
pub fn by_canonical<'a>(report: &'a Value, canonical: &str) -> &'a Value {
    report["candidates"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["canonical"] == canonical))
        .unwrap_or_else(|| panic!("no candidate '{canonical}' in {report}"))
}

/// The statistics every KLD candidate carries (besides `spec`, `canonical`).
pub const STAT_FIELDS: [&str; 21] = [
    "positions",
    "non_finite_positions",
    "mean_kld",
    "mean_kld_error",
    "max_kld",
    "min_kld",
    "kld_percentiles",
    "same_top_percent",
    "mean_delta_p",
    "mean_delta_p_error",
    "rms_delta_p",
    "max_delta_p",
    "min_delta_p",
    "delta_p_percentiles",
    "ppl_ref",
    "ppl_cand",
    "ppl_ratio",
    "kld_score",
    "kv_cache_bytes",
    "composite",
    "band",
];

/// A temporary folder with `name` holding `text`; returns both.
pub fn temp_file(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("temp file written");
    (dir, path)
}
