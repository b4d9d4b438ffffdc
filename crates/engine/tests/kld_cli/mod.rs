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

/// mlx-lm's float32 model, term for term (the fixtures come from it): the
/// settings of every comparison with mlx-lm.
pub const EXACT: [&str; 4] = ["--dtype", "float32", "--weights", "dequantized"];

/// The CPU's default path: the GGUF blocks as stored, 8-bit activations on
/// the CPU kernel family the environment names (the widest by default).
pub const NATIVE: [&str; 4] = ["--dtype", "float32", "--weights", "native"];

/// Runs `gemma-mlx SUBCOMMAND --model <default> EXACT --json ARGS…` and
/// returns the JSON object on stdout's last line; panics with stderr on
/// failure.
pub fn report(subcommand: &str, args: &[&str]) -> Value {
    report_with(&EXACT, None, subcommand, args)
}

/// [`report`] with the model settings `settings` and, when given, the CPU
/// kernel family `family` (`GEMMA_MLX_CPU_KERNELS`); the report must say it
/// ran with them.
pub fn report_with(
    settings: &[&str],
    family: Option<&str>,
    subcommand: &str,
    args: &[&str],
) -> Value {
    let model = model();
    let mut all = vec![subcommand, "--model", &model];
    all.extend_from_slice(settings);
    all.push("--json");
    all.extend_from_slice(args);
    let mut command = Command::new(env!("CARGO_BIN_EXE_gemma-mlx"));
    command.args(&all);
    if let Some(family) = family {
        command.env("GEMMA_MLX_CPU_KERNELS", family);
    }
    let report = json_of(&command.output().expect("gemma-mlx runs"));
    let weights = settings
        .iter()
        .position(|&a| a == "--weights")
        .and_then(|i| settings.get(i + 1));
    if let Some(weights) = weights {
        assert_eq!(report["settings"]["weights"], *weights, "{report}");
    }
    if let (Some(family), Some(&"native")) = (family, weights) {
        assert_eq!(report["settings"]["cpu_kernels"], family, "{report}");
    }
    report
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
