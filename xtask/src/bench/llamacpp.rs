//! llama.cpp beside ours on the CPU, on the default model's own GGUF file:
//! built once from the source in `../shared/llamacpp/` (`GGML_NATIVE=ON`
//! without AMX, about 9 minutes on 2 cores) under `target/llamacpp/`
//! ([`crate::llama_build`]), then `llama-bench`
//! and `gemma-mlx generate` (native and dequantized weights) alternate,
//! prompt 512 and 128 generated tokens as `llama-bench -p 512 -n 128`
//! measures them, each process's peak resident memory taken by GNU time.

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::bench::perplexity::{SweepComparison, SweepRuns};
use crate::bench::scratch::scratch_path;
use crate::command;
use crate::llama_build;

/// The vendored llama.cpp's commit.
const COMMIT: &str = "0c1e570";
/// Prompt tokens and generated tokens of every run.
pub const PROMPT: usize = 512;
/// Generated tokens of every run.
pub const GENERATED: usize = 128;

/// One engine's figures over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct EngineFigures {
    /// What ran.
    pub engine: String,
    /// Prompt tokens per second, one per round.
    pub prompt_tps: Vec<f64>,
    /// Generated tokens per second, one per round.
    pub generation_tps: Vec<f64>,
    /// Peak resident memory of the process, MiB, one per round.
    pub peak_rss_mib: Vec<f64>,
}

/// llama.cpp and our two weight storages on the same file.
#[derive(Clone, Debug, Serialize)]
pub struct LlamaComparison {
    /// llama.cpp's commit.
    pub commit: String,
    /// Threads every engine used.
    pub threads: usize,
    /// llama.cpp first, then ours with native and with dequantized weights.
    pub engines: Vec<EngineFigures>,
    /// Our KLD sweep beside llama-perplexity's, in the same rounds (absent
    /// when the bench ran no sweep).
    pub kld_sweep_vs_llama_perplexity: Option<SweepComparison>,
}

/// What became of the comparison with llama.cpp: its figures, or why there
/// are none (a failed build or run does not take the rest of the report
/// with it).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LlamaOutcome {
    /// Both engines ran every round.
    Measured(LlamaComparison),
    /// The build or a run failed.
    Failed {
        /// The error, with its causes.
        error: String,
    },
}

/// Runs llama.cpp and ours, alternating, `rounds` times; each round also
/// runs a round of `sweep` when there is one.
pub fn compare(
    llama_bench: &Path,
    gemma_mlx: &Path,
    model: &Path,
    rounds: usize,
    mut sweep: Option<SweepRuns>,
) -> Result<LlamaComparison> {
    let threads = llama_build::threads();
    let mut engines = vec![
        figures(format!("llama.cpp {COMMIT}, -t {threads}")),
        figures("gemma-mlx, --weights native".into()),
        figures("gemma-mlx, --weights dequantized".into()),
    ];
    for round in 0..rounds {
        println!("bench: llama.cpp beside ours, round {}/{rounds}", round + 1);
        let mut llama = Command::new(llama_bench);
        llama
            .arg("-m")
            .arg(model)
            .args(["-p", &PROMPT.to_string(), "-n", &GENERATED.to_string()])
            .args(["-t", &threads.to_string(), "-r", "1", "-o", "json"]);
        let (stdout, rss) = timed(&mut llama)?;
        let (prompt, generation) = llama_figures(&stdout)?;
        push(&mut engines[0], prompt, generation, rss);
        for (slot, weights) in [(1, "native"), (2, "dequantized")] {
            let mut ours = Command::new(gemma_mlx);
            ours.args(["generate", "--json", "--weights", weights])
                .args(["--synthetic-prompt", &PROMPT.to_string()])
                .args(["--max-tokens", &GENERATED.to_string()])
                .args(["--logit-bias", "1=-1e30", "--logit-bias", "106=-1e30"])
                .arg("--model")
                .arg(model);
            let (stdout, rss) = timed(&mut ours)?;
            let last = stdout.lines().last().unwrap_or_default();
            let json: serde_json::Value = serde_json::from_str(last)
                .with_context(|| format!("gemma-mlx generate printed no JSON last: {last}"))?;
            let field = |name: &str| json[name].as_f64().unwrap_or(f64::NAN);
            push(
                &mut engines[slot],
                field("prompt_tps"),
                field("generation_tps"),
                rss,
            );
        }
        if let Some(sweep) = sweep.as_mut() {
            sweep.round();
        }
    }
    Ok(LlamaComparison {
        commit: COMMIT.into(),
        threads,
        engines,
        kld_sweep_vs_llama_perplexity: sweep.map(SweepRuns::finish),
    })
}

fn figures(engine: String) -> EngineFigures {
    EngineFigures {
        engine,
        prompt_tps: Vec::new(),
        generation_tps: Vec::new(),
        peak_rss_mib: Vec::new(),
    }
}

fn push(figures: &mut EngineFigures, prompt: f64, generation: f64, rss_mib: f64) {
    figures.prompt_tps.push(prompt);
    figures.generation_tps.push(generation);
    figures.peak_rss_mib.push(rss_mib);
}

/// Runs `command` under GNU time: its stdout and its peak resident memory
/// in MiB (NaN when GNU time is missing).
fn timed(command: &mut Command) -> Result<(String, f64)> {
    let time = Path::new("/usr/bin/time");
    if !time.is_file() {
        return Ok((command::stdout_of(command)?, f64::NAN));
    }
    let report = scratch_path("rss");
    let mut wrapped = Command::new(time);
    wrapped
        .arg("-o")
        .arg(&report)
        .args(["-f", "%M"])
        .arg(command.get_program())
        .args(command.get_args());
    let stdout = command::stdout_of(&mut wrapped)?;
    let kib: f64 = fs::read_to_string(&report)
        .ok()
        .and_then(|t| t.lines().last().and_then(|l| l.trim().parse().ok()))
        .unwrap_or(f64::NAN);
    let _ = fs::remove_file(&report);
    Ok((stdout, kib / 1024.0))
}

/// Prompt and generation tokens per second from `llama-bench -o json`: the
/// test with a prompt and no generation, and the one with generation only.
fn llama_figures(stdout: &str) -> Result<(f64, f64)> {
    let tests: Vec<serde_json::Value> =
        serde_json::from_str(stdout).context("llama-bench printed no JSON array")?;
    let rate = |prompt: bool| {
        tests
            .iter()
            .find(|t| (t["n_prompt"].as_u64().unwrap_or(0) > 0) == prompt)
            .and_then(|t| t["avg_ts"].as_f64())
            .context("llama-bench's JSON lacks a test")
    };
    Ok((rate(true)?, rate(false)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_bench_json_gives_prompt_and_generation_rates() {
        let json = r#"[{"n_prompt": 512, "n_gen": 0, "avg_ts": 650.5},
                       {"n_prompt": 0, "n_gen": 128, "avg_ts": 77.25}]"#;
        assert_eq!(llama_figures(json).unwrap(), (650.5, 77.25));
        assert!(llama_figures("[]").is_err());
        assert!(llama_figures("not json").is_err());
    }
}
