//! `kld` and `trajectory`: KV-cache fidelity against a reference format.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use engine::kld::ranks::Ranks;
use engine::kld::report::{
    chunk_convention, CandidateReport, ChunkingReport, KldReport, KldSettingsReport, RankReport,
};
use engine::kld::stats::KldStats;
use engine::kld::sweep::{chunks, sweep, ChunkSettings, Side, SweepResult};
use engine::kld::trajectory::{
    agreement, greedy_ids, parse_prompts, PromptAgreement, TrajectoryPrompt,
};
use engine::options::default_decode;
use engine::{Engine, GenerateOptions, KvSpec};
use indicatif::{ProgressBar, ProgressStyle};
use mlx_core::device;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::model_args::ModelArgs;
use crate::output::print_json;
use crate::sampling_args::print_notes;

/// The KV specs compared.
#[derive(Debug, Args)]
pub struct SpecArgs {
    /// The reference KV spec (default: the compute dtype).
    #[arg(long = "ref", default_value = "")]
    pub reference: String,
    /// A candidate KV spec (repeatable).
    #[arg(long = "cand")]
    pub candidates: Vec<String>,
}

impl SpecArgs {
    /// The reference spec and the candidate specs, parsed.
    fn parse(&self) -> Result<(KvSpec, Vec<KvSpec>)> {
        parse_specs(&self.reference, &self.candidates)
    }
}

/// A reference spec and candidate specs, parsed (notes on stderr, once
/// each, see [`print_notes`]).
pub fn parse_specs(reference: &str, candidates: &[String]) -> Result<(KvSpec, Vec<KvSpec>)> {
    let reference = KvSpec::parse(reference)?;
    let candidates = candidates
        .iter()
        .map(|c| KvSpec::parse(c))
        .collect::<Result<Vec<_>, _>>()?;
    print_notes(
        &std::iter::once(&reference)
            .chain(&candidates)
            .collect::<Vec<_>>(),
    );
    Ok((reference, candidates))
}

/// Where a report goes besides the table on stdout.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Print one JSON object on stdout (instead of the table).
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON object to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `kld`.
#[derive(Debug, Args)]
pub struct KldArgs {
    /// Text to score (tokenized without special tokens).
    #[arg(long)]
    pub corpus: PathBuf,
    /// The specs.
    #[command(flatten)]
    pub specs: SpecArgs,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Most chunks to score.
    #[arg(long, default_value_t = 32)]
    pub chunks: usize,
    /// Keep each chunk's first token as the text has it. By default it is
    /// replaced with `<bos>`, as llama-perplexity scores: compare with
    /// llama.cpp and its TurboQuant fork that way; this flag gives the
    /// convention of REFRACT's MLX backend.
    #[arg(long)]
    pub no_bos: bool,
    /// `<bos>` at each chunk's start: the default, accepted for scripts
    /// that pass it.
    #[arg(long, hide = true, conflicts_with = "no_bos")]
    pub bos: bool,
    /// Score only the second half of each chunk.
    #[arg(long)]
    pub second_half: bool,
    /// Run the reference spec through the candidate path and check KLD 0.
    #[arg(long)]
    pub self_test: bool,
    /// Also score greedy trajectories of these prompts (JSON lines).
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Tokens per trajectory.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Recompute the reference for every candidate (the existing tool's method).
    #[arg(long)]
    pub two_forwards: bool,
    /// Reference model for a model-against-model comparison.
    #[arg(long, requires = "cand_model")]
    pub ref_model: Option<PathBuf>,
    /// Candidate model for a model-against-model comparison.
    #[arg(long, requires = "ref_model")]
    pub cand_model: Option<PathBuf>,
    /// The model (when not comparing two models).
    #[command(flatten)]
    pub model: ModelArgs,
    /// The report's outputs.
    #[command(flatten)]
    pub report: ReportArgs,
}

/// `trajectory`.
#[derive(Debug, Args)]
pub struct TrajectoryArgs {
    /// Prompts, one JSON object per line: {"prompt": "...", "chat": false}.
    #[arg(long)]
    pub prompts: PathBuf,
    /// The specs (at least one candidate).
    #[command(flatten)]
    pub specs: SpecArgs,
    /// Tokens per trajectory.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The report's outputs.
    #[command(flatten)]
    pub report: ReportArgs,
}

fn load_with(model: &ModelArgs, path: Option<&PathBuf>, quiet: bool) -> Result<Engine> {
    let mut args = model.clone();
    if let Some(path) = path {
        args.model = Some(path.clone());
        args.random_weights = None;
    }
    args.load(quiet)
}

/// Greedy decoding of `max_tokens` over caches of `spec` on `engine`, in the
/// decoding mode the command line picks for its model ([`default_decode`]).
fn greedy_options(engine: &Engine, spec: &KvSpec, max_tokens: usize) -> Result<GenerateOptions> {
    Ok(GenerateOptions {
        max_tokens,
        cache_formats: spec.layer_formats(&engine.loaded.model.config)?,
        kv_start: spec.start,
        kv_queries: spec.queries,
        decode: default_decode(&engine.loaded.model)?,
        ..GenerateOptions::default()
    })
}

fn read_prompts(path: &Path) -> Result<Vec<TrajectoryPrompt>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(parse_prompts(&text, &path.display().to_string())?)
}

/// For each candidate spec (run on `candidate`), how its greedy trajectory
/// of every prompt agrees with the reference's.
fn trajectory_agreements(
    (reference, reference_spec): (&Engine, &KvSpec),
    candidate: &Engine,
    specs: &[KvSpec],
    prompts: &[TrajectoryPrompt],
    max_tokens: usize,
) -> Result<Vec<Vec<PromptAgreement>>> {
    let reference_ids = greedy_ids(
        reference,
        prompts,
        &greedy_options(reference, reference_spec, max_tokens)?,
    )?;
    specs
        .iter()
        .map(|spec| {
            let ids = greedy_ids(
                candidate,
                prompts,
                &greedy_options(candidate, spec, max_tokens)?,
            )?;
            Ok(reference_ids
                .iter()
                .zip(&ids)
                .map(|(r, c)| agreement(r, c))
                .collect())
        })
        .collect()
}

/// Writes the report where `outputs` asks: the file, then stdout as JSON or
/// as the table.
fn finish(report: &KldReport, outputs: &ReportArgs) -> Result<()> {
    let value = serde_json::to_value(report)?;
    if let Some(out) = &outputs.out {
        std::fs::write(out, serde_json::to_string_pretty(&value)?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    if outputs.json {
        print_json(&value)?;
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

/// What a KLD sweep scores: the corpus, the specs, the chunking and the
/// optional trajectory axis.
pub struct KldJob<'a> {
    /// Text to score.
    pub corpus: &'a Path,
    /// The reference spec.
    pub reference: KvSpec,
    /// The candidate specs.
    pub candidates: Vec<KvSpec>,
    /// Tokens per chunk.
    pub ctx: usize,
    /// Most chunks.
    pub chunks: usize,
    /// Each chunk's first token replaced with `<bos>`.
    pub bos: bool,
    /// Only the second half of each chunk scored.
    pub second_half: bool,
    /// The reference recomputed for every candidate.
    pub two_forwards: bool,
    /// Prompts whose greedy trajectories are also scored.
    pub prompts: Option<&'a Path>,
    /// Tokens per trajectory.
    pub max_tokens: usize,
    /// No progress bar.
    pub quiet: bool,
}

/// Runs `kld`, alone or as one rank of a run that `mlx.launch` started
/// (rank 0 writes the report).
pub fn kld(args: KldArgs) -> Result<()> {
    let (reference, mut candidates) = args.specs.parse()?;
    if args.self_test {
        candidates.insert(0, reference.clone());
    }
    let two_models = args.ref_model.is_some();
    if candidates.is_empty() {
        if !two_models {
            bail!("no candidates: give --cand SPEC (repeatable), --self-test, or --ref-model/--cand-model");
        }
        candidates.push(reference.clone());
    }
    let ranks = Ranks::join()?;
    let quiet = args.report.json || ranks.rank() != 0;
    let job = KldJob {
        corpus: &args.corpus,
        reference,
        candidates,
        ctx: args.ctx,
        chunks: args.chunks,
        bos: !args.no_bos,
        second_half: args.second_half,
        two_forwards: args.two_forwards,
        prompts: args.prompts.as_deref(),
        max_tokens: args.max_tokens,
        quiet,
    };
    let local = (|| -> Result<_> {
        let ref_engine = load_with(&args.model, args.ref_model.as_ref(), quiet)?;
        let cand_engine = match &args.cand_model {
            Some(path) => Some(load_with(&args.model, Some(path), quiet)?),
            None => None,
        };
        let input = KldInput::read(&ref_engine, &job)?;
        let share = kld_share(&ref_engine, cand_engine.as_ref(), &job, &input, &ranks)?;
        Ok((ref_engine, cand_engine, input, share))
    })();
    let shares = ranks.gather(local.as_ref().map(|l| &l.3).map_err(|e| format!("{e:#}")))?;
    let (ref_engine, cand_engine, input, _) = local?;
    if ranks.rank() != 0 {
        return Ok(());
    }
    let report = kld_assemble(&ref_engine, cand_engine.as_ref(), &job, &input, shares)?;
    finish(&report, &args.report)?;
    if args.self_test {
        let c = &report.candidates[0];
        let stats = c.stats.as_ref();
        let passed = stats.is_some_and(|s| s.mean_kld == 0.0 && s.same_top_percent == 100.0)
            && c.composite >= 99.5;
        if !passed {
            bail!("self-test failed: the reference run through the candidate path gives mean KLD {:?}, composite {:.3}", stats.map(|s| s.mean_kld), c.composite);
        }
        eprintln!(
            "self-test passed: KLD 0, 100% same top token, composite {:.2}",
            c.composite
        );
    }
    Ok(())
}

/// What every rank of a KLD job reads alike before its share: the corpus,
/// its chunks and the trajectory prompts.
pub struct KldInput {
    corpus: Vec<u8>,
    settings: ChunkSettings,
    chunks: Vec<Vec<u32>>,
    prompts: Option<Vec<TrajectoryPrompt>>,
}

impl KldInput {
    /// Reads and cuts `job`'s corpus with `ref_engine`'s tokenizer, and
    /// reads its prompts.
    pub fn read(ref_engine: &Engine, job: &KldJob<'_>) -> Result<KldInput> {
        let corpus = std::fs::read(job.corpus)
            .with_context(|| format!("reading {}", job.corpus.display()))?;
        let text = std::str::from_utf8(&corpus)
            .with_context(|| format!("{} is not UTF-8 text", job.corpus.display()))?;
        let tokenizer = ref_engine.tokenizer()?;
        let tokens = tokenizer.encode_plain(text)?;
        let settings = ChunkSettings {
            ctx: job.ctx,
            chunks: job.chunks,
            bos: job.bos.then(|| tokenizer.bos_id()),
            second_half: job.second_half,
            two_forwards: job.two_forwards,
        };
        let chunks = chunks(&tokens, &settings)?;
        let prompts = job.prompts.map(read_prompts).transpose()?;
        Ok(KldInput {
            corpus,
            settings,
            chunks,
            prompts,
        })
    }
}

/// One rank's part of a job: the sweep over its chunks and the trajectory
/// agreements of its prompts (per candidate), as it sends them to rank 0.
#[derive(Serialize, Deserialize)]
pub struct Share {
    sweep: Option<SweepResult>,
    trajectories: Option<Vec<Vec<PromptAgreement>>>,
    rank: RankReport,
}

impl Share {
    /// The shares' trajectory agreements joined in rank order, per
    /// candidate (`None` when no prompts were given).
    fn trajectories(shares: &mut [Share], candidates: usize) -> Option<Vec<Vec<PromptAgreement>>> {
        let mut joined = vec![Vec::new(); candidates];
        for share in shares.iter_mut() {
            for (all, more) in joined.iter_mut().zip(share.trajectories.take()?) {
                all.extend(more);
            }
        }
        Some(joined)
    }
}

/// The KLD report of `job` on loaded engines (the candidates on
/// `cand_engine` when given, else on `ref_engine`), in this process alone.
pub fn kld_report(
    ref_engine: &Engine,
    cand_engine: Option<&Engine>,
    job: &KldJob<'_>,
) -> Result<KldReport> {
    let input = KldInput::read(ref_engine, job)?;
    let share = kld_share(ref_engine, cand_engine, job, &input, &Ranks::alone())?;
    kld_assemble(ref_engine, cand_engine, job, &input, vec![share])
}

/// This rank's share of `job`: its chunks through the reference and every
/// candidate, then its prompts' trajectories.
fn kld_share(
    ref_engine: &Engine,
    cand_engine: Option<&Engine>,
    job: &KldJob<'_>,
    input: &KldInput,
    ranks: &Ranks,
) -> Result<Share> {
    let cand_model = cand_engine.unwrap_or(ref_engine);
    let reference = Side {
        model: &ref_engine.loaded.model,
        formats: job
            .reference
            .layer_formats(&ref_engine.loaded.model.config)?,
        start: job.reference.start,
        queries: job.reference.queries,
    };
    let sides = job
        .candidates
        .iter()
        .map(|s| {
            Ok(Side {
                model: &cand_model.loaded.model,
                formats: s.layer_formats(&cand_model.loaded.model.config)?,
                start: s.start,
                queries: s.queries,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let chunk_list = &input.chunks[ranks.share(input.chunks.len())];
    let bar = if job.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(chunk_list.len() as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("kld [{bar:30}] {pos}/{len} chunks {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let start = Instant::now();
    let sweep = sweep(
        &reference,
        &sides,
        chunk_list,
        &input.settings,
        &mut |done, _| bar.set_position(done as u64),
    )?;
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    let (trajectories, prompts) = match &input.prompts {
        Some(all) => {
            let prompts = &all[ranks.share(all.len())];
            let agreements = trajectory_agreements(
                (ref_engine, &job.reference),
                cand_model,
                &job.candidates,
                prompts,
                job.max_tokens,
            )?;
            (Some(agreements), prompts.len())
        }
        None => (None, 0),
    };
    Ok(Share {
        rank: RankReport {
            rank: ranks.rank(),
            device: device::default_device()?.name().to_string(),
            chunks: sweep.chunks,
            prompts,
            seconds,
        },
        sweep: Some(sweep),
        trajectories,
    })
}

/// The report of `job` from every rank's share, in rank order.
fn kld_assemble(
    ref_engine: &Engine,
    cand_engine: Option<&Engine>,
    job: &KldJob<'_>,
    input: &KldInput,
    mut shares: Vec<Share>,
) -> Result<KldReport> {
    let cand_model = cand_engine.unwrap_or(ref_engine);
    let trajectories = match Share::trajectories(&mut shares, job.candidates.len()) {
        Some(per_candidate) => per_candidate.into_iter().map(Some).collect(),
        None => vec![None; job.candidates.len()],
    };
    let ranks: Vec<RankReport> = shares.iter().map(|s| s.rank.clone()).collect();
    let seconds = ranks.iter().map(|r| r.seconds).fold(0.0, f64::max);
    let result = SweepResult::merge(shares.into_iter().filter_map(|s| s.sweep).collect())
        .context("no rank returned a sweep")?;
    let dtype = ref_engine.loaded.model.dtype;
    let mut candidates = Vec::new();
    for (i, spec) in job.candidates.iter().enumerate() {
        let stats = KldStats::from_samples(&result.samples[i]);
        if stats.is_none() {
            bail!(
                "candidate '{}': every scored position was non-finite",
                spec.text
            );
        }
        candidates.push(CandidateReport::new(
            spec.text.clone(),
            spec.canonical_on(dtype, &cand_model.loaded.model.config)?,
            stats,
            Some(result.candidate_cache_bytes[i]),
            trajectories[i].clone(),
        ));
    }
    Ok(KldReport {
        settings: KldSettingsReport {
            model: ref_engine.loaded.name.clone(),
            cand_model: cand_engine.map(|e| e.loaded.name.clone()),
            corpus: job.corpus.display().to_string(),
            corpus_sha256: format!("{:x}", Sha256::digest(&input.corpus)),
            chunking: Some(ChunkingReport {
                ctx: job.ctx,
                chunks: result.chunks,
                chunks_requested: job.chunks,
                bos: job.bos,
                convention: chunk_convention(job.bos),
                second_half: job.second_half,
                two_forwards: job.two_forwards,
                forwards: result.forwards,
                reference_kv_cache_bytes: result.reference_cache_bytes,
                active_memory_bytes: result.active_memory,
            }),
            seconds,
            world_size: ranks.len(),
            ranks,
            mlx_version: device::mlx_version(),
            device: device::default_device()?.name().to_string(),
            dtype: dtype.name().to_string(),
            products: ref_engine.products(),
            reference_spec: job.reference.text.clone(),
            reference_canonical: job
                .reference
                .canonical_on(dtype, &ref_engine.loaded.model.config)?,
        },
        candidates,
    })
}

/// Runs `trajectory`, alone or as one rank of a run that `mlx.launch`
/// started (rank 0 writes the report).
pub fn trajectory(args: TrajectoryArgs) -> Result<()> {
    let (reference, candidates) = args.specs.parse()?;
    if candidates.is_empty() {
        bail!("no candidates: give --cand SPEC (repeatable)");
    }
    let ranks = Ranks::join()?;
    let quiet = args.report.json || ranks.rank() != 0;
    let specs = (&reference, candidates.as_slice());
    let local = (|| -> Result<_> {
        let engine = args.model.load(quiet)?;
        let prompts = read_prompts(&args.prompts)?;
        let share = trajectory_share(&engine, specs, &prompts, args.max_tokens, &ranks)?;
        Ok((engine, share))
    })();
    let shares = ranks.gather(local.as_ref().map(|l| &l.1).map_err(|e| format!("{e:#}")))?;
    let (engine, _) = local?;
    if ranks.rank() != 0 {
        return Ok(());
    }
    let report = trajectory_assemble(&engine, specs, &args.prompts, shares)?;
    finish(&report, &args.report)
}

/// How the greedy trajectories of the prompts in the file `prompts` under
/// each candidate spec agree with the reference's, on a loaded engine, in
/// this process alone.
pub fn trajectory_report(
    engine: &Engine,
    specs: (&KvSpec, &[KvSpec]),
    prompts: &Path,
    max_tokens: usize,
) -> Result<KldReport> {
    if specs.1.is_empty() {
        bail!("no candidates: give --cand SPEC (repeatable)");
    }
    let prompt_list = read_prompts(prompts)?;
    let share = trajectory_share(engine, specs, &prompt_list, max_tokens, &Ranks::alone())?;
    trajectory_assemble(engine, specs, prompts, vec![share])
}

/// This rank's share of the prompts, decoded under the reference and every
/// candidate.
fn trajectory_share(
    engine: &Engine,
    (reference_spec, specs): (&KvSpec, &[KvSpec]),
    prompts: &[TrajectoryPrompt],
    max_tokens: usize,
    ranks: &Ranks,
) -> Result<Share> {
    let prompts = &prompts[ranks.share(prompts.len())];
    let start = Instant::now();
    let agreements =
        trajectory_agreements((engine, reference_spec), engine, specs, prompts, max_tokens)?;
    Ok(Share {
        sweep: None,
        trajectories: Some(agreements),
        rank: RankReport {
            rank: ranks.rank(),
            device: device::default_device()?.name().to_string(),
            chunks: 0,
            prompts: prompts.len(),
            seconds: start.elapsed().as_secs_f64(),
        },
    })
}

/// The trajectory report from every rank's share, in rank order.
fn trajectory_assemble(
    engine: &Engine,
    (reference_spec, specs): (&KvSpec, &[KvSpec]),
    prompts: &Path,
    mut shares: Vec<Share>,
) -> Result<KldReport> {
    let agreements =
        Share::trajectories(&mut shares, specs.len()).context("no rank returned trajectories")?;
    let ranks: Vec<RankReport> = shares.iter().map(|s| s.rank.clone()).collect();
    let dtype = engine.loaded.model.dtype;
    let config = &engine.loaded.model.config;
    let candidates = specs
        .iter()
        .zip(agreements)
        .map(|(spec, a)| {
            Ok(CandidateReport::new(
                spec.text.clone(),
                spec.canonical_on(dtype, config)?,
                None,
                None,
                Some(a),
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(KldReport {
        settings: KldSettingsReport {
            model: engine.loaded.name.clone(),
            cand_model: None,
            corpus: prompts.display().to_string(),
            corpus_sha256: format!("{:x}", Sha256::digest(std::fs::read(prompts)?)),
            chunking: None,
            seconds: ranks.iter().map(|r| r.seconds).fold(0.0, f64::max),
            world_size: ranks.len(),
            ranks,
            mlx_version: device::mlx_version(),
            device: device::default_device()?.name().to_string(),
            dtype: dtype.name().to_string(),
            products: engine.products(),
            reference_spec: reference_spec.text.clone(),
            reference_canonical: reference_spec.canonical_on(dtype, config)?,
        },
        candidates,
    })
}
