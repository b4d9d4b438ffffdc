//! The report of a sweep: settings, and per candidate every statistic, the
//! scores and the band.

use serde::{Deserialize, Serialize};

use crate::engine::ProductPath;
use crate::kld::stats::{band, composite, KldStats};
use crate::kld::sweep::ActiveMemory;
use crate::kld::trajectory::{trajectory_score, PromptAgreement};

/// Settings a report was made with.
#[derive(Debug, Clone, Serialize)]
pub struct KldSettingsReport {
    /// The model (or the reference model in two-model mode).
    pub model: String,
    /// The candidate model in two-model mode.
    pub cand_model: Option<String>,
    /// The corpus file (the prompts file for trajectories alone).
    pub corpus: String,
    /// sha256 of that file.
    pub corpus_sha256: String,
    /// How the corpus was cut into chunks (absent for trajectories alone).
    #[serde(flatten)]
    pub chunking: Option<ChunkingReport>,
    /// Seconds the sweep took (the slowest rank's share).
    pub seconds: f64,
    /// Processes the sweep was spread over (1: this one alone).
    pub world_size: usize,
    /// What each rank ran, in rank order.
    pub ranks: Vec<RankReport>,
    /// MLX's version.
    pub mlx_version: String,
    /// The device.
    pub device: String,
    /// The compute dtype.
    pub dtype: String,
    /// How the products compute.
    #[serde(flatten)]
    pub products: ProductPath,
    /// The reference spec as typed.
    pub reference_spec: String,
    /// Its canonical form.
    pub reference_canonical: String,
}

/// One rank's part of a sweep: a contiguous share of the chunks and of
/// the prompts ([`crate::kld::ranks::share`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankReport {
    /// The rank.
    pub rank: usize,
    /// The device it computed on.
    pub device: String,
    /// Chunks it scored.
    pub chunks: usize,
    /// Trajectory prompts it decoded.
    pub prompts: usize,
    /// Seconds its share took.
    pub seconds: f64,
}

/// How a KLD sweep cut and ran its corpus.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkingReport {
    /// Tokens per chunk.
    pub ctx: usize,
    /// Chunks scored.
    pub chunks: usize,
    /// Chunks asked for.
    pub chunks_requested: usize,
    /// Each chunk's first token replaced with `<bos>`.
    pub bos: bool,
    /// The chunk convention in words (see [`chunk_convention`]).
    pub convention: &'static str,
    /// Only the second half of each chunk scored.
    pub second_half: bool,
    /// The reference recomputed for every candidate.
    pub two_forwards: bool,
    /// Forward passes run.
    pub forwards: usize,
    /// Reference KV-cache bytes at the chunk length.
    pub reference_kv_cache_bytes: usize,
    /// MLX's active memory between chunks (flat over a long sweep unless
    /// something leaks).
    pub active_memory_bytes: ActiveMemory,
}

/// One candidate's results.
#[derive(Debug, Clone, Serialize)]
pub struct CandidateReport {
    /// The spec as typed.
    pub spec: String,
    /// Its canonical form.
    pub canonical: String,
    /// The KLD statistics (absent when only trajectories were run).
    #[serde(flatten)]
    pub stats: Option<KldStats>,
    /// KV-cache bytes at the chunk length.
    pub kv_cache_bytes: Option<usize>,
    /// Trajectory score, when prompts were given.
    pub trajectory_score: Option<f64>,
    /// Per-prompt trajectory agreement.
    pub trajectories: Option<Vec<PromptAgreement>>,
    /// Harmonic mean of the scores present.
    pub composite: f64,
    /// EXCELLENT, PASS, DEGRADED or FAIL.
    pub band: &'static str,
}

impl CandidateReport {
    /// Assembles a candidate's report from the axes that were run.
    pub fn new(
        spec: String,
        canonical: String,
        stats: Option<KldStats>,
        kv_cache_bytes: Option<usize>,
        trajectories: Option<Vec<PromptAgreement>>,
    ) -> CandidateReport {
        let trajectory_score = trajectories.as_deref().map(trajectory_score);
        let scores: Vec<f64> = stats
            .as_ref()
            .map(|s| s.kld_score)
            .into_iter()
            .chain(trajectory_score)
            .collect();
        let composite = composite(&scores);
        CandidateReport {
            spec,
            canonical,
            stats,
            kv_cache_bytes,
            trajectory_score,
            trajectories,
            composite,
            band: band(composite),
        }
    }
}

/// A whole report.
#[derive(Debug, Clone, Serialize)]
pub struct KldReport {
    /// How it was made.
    pub settings: KldSettingsReport,
    /// The candidates, in the order given.
    pub candidates: Vec<CandidateReport>,
}

/// The chunk convention of a sweep, in words: `<bos>` in place of each
/// chunk's first token is how llama-perplexity scores (and how Gemma 3 was
/// trained to see a sequence start); without it a chunk starts mid-text,
/// as REFRACT's MLX backend scored.
pub fn chunk_convention(bos: bool) -> &'static str {
    if bos {
        "<bos> at each chunk's start (llama-perplexity's)"
    } else {
        "chunks start mid-text, no <bos> (REFRACT's MLX backend's)"
    }
}

impl KldReport {
    /// A table for people.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<36} {:>18} {:>9} {:>9} {:>9} {:>7} {:>8} {:>8} {:>9} {:>7} {:>7} {:>7}  {}\n",
            "candidate",
            "mean KLD",
            "median",
            "p99",
            "max",
            "top %",
            "rms Δp",
            "PPL x",
            "KV MiB",
            "KLD sc",
            "traj",
            "comp",
            "band"
        );
        let f =
            |v: Option<f64>, p: usize| v.map_or_else(|| "-".to_string(), |v| format!("{v:.p$}"));
        for c in &self.candidates {
            let s = c.stats.as_ref();
            out.push_str(&format!(
                "{:<36} {:>18} {:>9} {:>9} {:>9} {:>7} {:>8} {:>8} {:>9} {:>7} {:>7} {:>7.2}  {}\n",
                c.canonical,
                s.map_or_else(
                    || "-".into(),
                    |s| format!("{:.6} ± {:.6}", s.mean_kld, s.mean_kld_error)
                ),
                f(s.map(|s| s.kld_percentiles.median), 6),
                f(s.map(|s| s.kld_percentiles.p99), 5),
                f(s.map(|s| s.max_kld), 4),
                f(s.map(|s| s.same_top_percent), 2),
                f(s.map(|s| s.rms_delta_p), 5),
                f(s.map(|s| s.ppl_ratio), 4),
                f(c.kv_cache_bytes.map(|b| b as f64 / (1 << 20) as f64), 2),
                f(s.map(|s| s.kld_score), 2),
                f(c.trajectory_score, 2),
                c.composite,
                c.band
            ));
        }
        if let Some(c) = &self.settings.chunking {
            out.push_str(&format!(
                "{} chunks of {} tokens{}; {}\n",
                c.chunks,
                c.ctx,
                if c.second_half {
                    ", second halves scored"
                } else {
                    ""
                },
                c.convention
            ));
        }
        out
    }
}
