//! Our KLD sweep against llama-perplexity's on the same GGUF file, corpus
//! and chunks. llama-perplexity needs two runs, each loading the model: the
//! reference (an f16 cache, its log-probabilities written to a file) and
//! the candidate (`--kl-divergence`). Ours is one `gemma-mlx kld` with the
//! same reference and candidate, second halves scored as llama-perplexity
//! scores them. Both are timed from start to exit, model loading included.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::bench::llamacpp::tempfile_path;
use crate::bench::stats::median;
use crate::command;
use crate::compare_kld::parse_perplexity_mean;

/// The candidate's key and value types (llama.cpp's names; ours mean the
/// same blocks).
const CANDIDATE: (&str, &str) = ("q8_0", "q8_0");
/// Tokens per chunk.
const CTX: usize = 512;

/// The sweep's figures over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct SweepComparison {
    /// The candidate, scored against an f16 cache.
    pub candidate: String,
    /// Chunks of the corpus.
    pub chunks: usize,
    /// Tokens per chunk.
    pub ctx: usize,
    /// Median seconds of our sweep.
    pub ours_seconds: f64,
    /// Median seconds of llama-perplexity's reference run and candidate run
    /// together.
    pub llama_perplexity_seconds: f64,
    /// Our seconds, one per round.
    pub ours_rounds: Vec<f64>,
    /// llama-perplexity's seconds, one per round.
    pub llama_perplexity_rounds: Vec<f64>,
    /// The mean KLD we reported (last round).
    pub ours_mean_kld: f64,
    /// The mean KLD llama-perplexity reported (last round).
    pub llama_perplexity_mean_kld: f64,
    /// Why the rounds stopped early, if a run failed (the figures above are
    /// those of the rounds before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What both sweeps run on, and what the rounds measured so far.
pub struct SweepRuns<'a> {
    llama_perplexity: &'a Path,
    gemma_mlx: &'a Path,
    model: &'a Path,
    corpus: &'a Path,
    chunks: usize,
    threads: usize,
    ours: Vec<f64>,
    theirs: Vec<f64>,
    ours_kld: f64,
    their_kld: f64,
    error: Option<String>,
}

impl<'a> SweepRuns<'a> {
    /// No rounds yet: llama.cpp's `llama-perplexity` with `threads` threads
    /// (ours uses every core, its default) and our `gemma-mlx` on `chunks`
    /// chunks of `corpus`.
    pub fn new(
        llama_perplexity: &'a Path,
        gemma_mlx: &'a Path,
        model: &'a Path,
        corpus: &'a Path,
        chunks: usize,
        threads: usize,
    ) -> Self {
        SweepRuns {
            llama_perplexity,
            gemma_mlx,
            model,
            corpus,
            chunks,
            threads,
            ours: Vec::new(),
            theirs: Vec::new(),
            ours_kld: f64::NAN,
            their_kld: f64::NAN,
            error: None,
        }
    }

    /// Runs one round unless one failed before; a failure is kept for the
    /// report and ends the rounds, not the bench.
    pub fn round(&mut self) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.measure() {
            eprintln!("bench: the KLD sweep beside llama-perplexity failed: {e:#}");
            self.error = Some(format!("{e:#}"));
        }
    }

    /// Runs llama-perplexity's two runs, then ours.
    fn measure(&mut self) -> Result<()> {
        let base = tempfile_path("kld-base");
        let started = Instant::now();
        let mut reference = self.perplexity("f16", "f16");
        reference.arg("--kl-divergence-base").arg(&base);
        output_checked(&mut reference, "reference")?;
        let mut candidate_run = self.perplexity(CANDIDATE.0, CANDIDATE.1);
        candidate_run
            .arg("--kl-divergence-base")
            .arg(&base)
            .arg("--kl-divergence");
        let text = output_checked(&mut candidate_run, "candidate")?;
        self.theirs.push(started.elapsed().as_secs_f64());
        std::fs::remove_file(&base).ok();
        self.their_kld = parse_perplexity_mean(&text)
            .context("llama-perplexity's candidate run printed no mean KLD")?
            .kld;

        let mut ours = Command::new(self.gemma_mlx);
        ours.arg("kld")
            .arg("--model")
            .arg(self.model)
            .arg("--corpus")
            .arg(self.corpus)
            .args([
                "--ctx",
                &CTX.to_string(),
                "--chunks",
                &self.chunks.to_string(),
            ])
            .args(["--second-half", "--ref", "ctk=f16,ctv=f16", "--json"])
            .args(["--cand", &candidate()]);
        let started = Instant::now();
        let stdout = command::stdout_of(&mut ours)?;
        self.ours.push(started.elapsed().as_secs_f64());
        let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
            .context("gemma-mlx kld printed no JSON report")?;
        self.ours_kld = report["candidates"][0]["mean_kld"]
            .as_f64()
            .context("gemma-mlx kld's report has no mean KLD")?;
        Ok(())
    }

    /// The figures of the rounds run.
    pub fn finish(self) -> SweepComparison {
        let mid = |values: &[f64]| median(values).unwrap_or(f64::NAN);
        SweepComparison {
            candidate: candidate(),
            chunks: self.chunks,
            ctx: CTX,
            ours_seconds: mid(&self.ours),
            llama_perplexity_seconds: mid(&self.theirs),
            ours_mean_kld: self.ours_kld,
            llama_perplexity_mean_kld: self.their_kld,
            ours_rounds: self.ours,
            llama_perplexity_rounds: self.theirs,
            error: self.error,
        }
    }

    /// llama-perplexity over the corpus with a cache of these types.
    fn perplexity(&self, keys: &str, values: &str) -> Command {
        let mut c = Command::new(self.llama_perplexity);
        c.arg("-m")
            .arg(self.model)
            .arg("-f")
            .arg(self.corpus)
            .args(["-c", &CTX.to_string(), "--chunks", &self.chunks.to_string()])
            .args(["-t", &self.threads.to_string(), "-fa", "on"])
            .args(["-ctk", keys, "-ctv", values]);
        c
    }
}

/// `ctk=…,ctv=…` of the candidate.
fn candidate() -> String {
    format!("ctk={},ctv={}", CANDIDATE.0, CANDIDATE.1)
}

/// Runs a llama-perplexity command: its stdout and stderr together, or an
/// error naming `which` run failed, with what it printed.
fn output_checked(run: &mut Command, which: &str) -> Result<String> {
    println!("$ {}", command::describe(run));
    let output = command::capture(run)?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        bail!(
            "llama-perplexity's {which} run failed ({}):\n{text}",
            output.status
        );
    }
    Ok(text)
}
