//! Our KLD sweep against llama-perplexity's on the same GGUF file, corpus
//! and chunks. llama-perplexity needs two runs, each loading the model: the
//! reference (an f16 cache, its log-probabilities written to a file) and
//! the candidate (`--kl-divergence`). Ours is one `gemma-mlx kld` with the
//! same reference and candidate, second halves scored as llama-perplexity
//! scores them. Both are timed from start to exit, model loading included.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::bench::stats::median;
use crate::llama_perplexity::{ours_means, Perplexity, CTX};

/// The candidate's key and value types (llama.cpp's names; ours mean the
/// same blocks).
const CANDIDATE: (&str, &str) = ("q8_0", "q8_0");

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
    perplexity: Perplexity<'a>,
    gemma_mlx: &'a Path,
    corpus: &'a Path,
    ours: Vec<f64>,
    theirs: Vec<f64>,
    ours_kld: f64,
    their_kld: f64,
    error: Option<String>,
}

impl<'a> SweepRuns<'a> {
    /// No rounds yet: `perplexity`'s chunks of `corpus`, and our `gemma-mlx`
    /// on the same model and chunks (on every core, its default).
    pub fn new(perplexity: Perplexity<'a>, gemma_mlx: &'a Path, corpus: &'a Path) -> Self {
        SweepRuns {
            perplexity,
            gemma_mlx,
            corpus,
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
        let p = &self.perplexity;
        let started = Instant::now();
        p.write_base(self.corpus)?;
        let theirs = p.mean(CANDIDATE.0, CANDIDATE.1)?;
        self.theirs.push(started.elapsed().as_secs_f64());
        std::fs::remove_file(&p.base).ok();
        self.their_kld = theirs.kld;

        let started = Instant::now();
        let ours = ours_means(
            self.gemma_mlx,
            p.model,
            self.corpus,
            p.chunks,
            &[candidate()],
        )?;
        self.ours.push(started.elapsed().as_secs_f64());
        self.ours_kld = ours
            .first()
            .context("gemma-mlx kld's report has no candidate")?
            .kld;
        Ok(())
    }

    /// The figures of the rounds run.
    pub fn finish(self) -> SweepComparison {
        let mid = |values: &[f64]| median(values).unwrap_or(f64::NAN);
        SweepComparison {
            candidate: candidate(),
            chunks: self.perplexity.chunks,
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
}

/// `ctk=…,ctv=…` of the candidate.
fn candidate() -> String {
    format!("ctk={},ctv={}", CANDIDATE.0, CANDIDATE.1)
}
