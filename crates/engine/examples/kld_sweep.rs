//! A KLD sweep of three KV-cache formats against the float cache, from
//! Rust: one short chunk of the shipped corpus runs once through the
//! reference and once through each candidate, and the per-candidate reports
//! are read field by field to pick the smallest cache that stays EXCELLENT.
//!
//! `cargo run --release --example kld_sweep [CORPUS]`

mod common;

use std::path::PathBuf;

use anyhow::{bail, ensure, Context, Result};
use engine::kld::report::CandidateReport;
use engine::kld::stats::KldStats;
use engine::kld::sweep::{chunks, sweep, ChunkSettings, Side};
use engine::KvSpec;

/// The candidates: llama.cpp's 8-bit and 4-bit blocks, and 3-bit TurboQuant.
const CANDIDATES: [&str; 3] = [
    "ctk=q8_0,ctv=q8_0",
    "ctk=q4_0,ctv=q4_0",
    "ctk=turbo3,ctv=turbo3",
];

/// The corpus the `kld` tests score: real prose, about 4,000 tokens.
fn default_corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../gemma/tests/fixtures/text/essays.txt")
}

fn main() -> Result<()> {
    let corpus = std::env::args_os()
        .nth(1)
        .map_or_else(default_corpus, PathBuf::from);
    let engine = common::load_default_engine()?;
    let model = &engine.loaded.model;
    let tokenizer = engine.tokenizer()?;
    let text = std::fs::read_to_string(&corpus)
        .with_context(|| format!("reading {}", corpus.display()))?;

    // One chunk of 128 tokens, starting with <bos>: 127 scored positions.
    let settings = ChunkSettings {
        ctx: 128,
        chunks: 1,
        bos: Some(tokenizer.bos_id()),
        second_half: false,
        two_forwards: false,
    };
    let chunk_list = chunks(&tokenizer.encode_plain(&text)?, &settings)?;

    let reference_spec = KvSpec::parse("")?;
    let specs = CANDIDATES
        .iter()
        .map(|text| KvSpec::parse(text))
        .collect::<Result<Vec<_>, _>>()?;
    let side = |spec: &KvSpec| -> Result<Side<'_>> {
        Ok(Side {
            model,
            formats: spec.layer_formats(&model.config)?,
            start: spec.start,
            queries: spec.queries,
        })
    };
    let candidates = specs.iter().map(side).collect::<Result<Vec<_>>>()?;
    let result = sweep(
        &side(&reference_spec)?,
        &candidates,
        &chunk_list,
        &settings,
        &mut |_, _| {},
    )?;
    ensure!(
        result.forwards == 1 + CANDIDATES.len(),
        "the reference ran once, each candidate once: {} forwards",
        result.forwards
    );

    let mut reports = Vec::new();
    for ((spec, samples), bytes) in specs
        .iter()
        .zip(&result.samples)
        .zip(&result.candidate_cache_bytes)
    {
        let Some(stats) = KldStats::from_samples(samples) else {
            bail!("{}: no finite position", spec.text);
        };
        ensure!(stats.positions == settings.ctx - 1, "{}", spec.text);
        let canonical = spec.canonical(model.dtype);
        reports.push(CandidateReport::new(
            spec.text.clone(),
            canonical,
            Some(stats),
            Some(*bytes),
            None,
        ));
    }

    println!(
        "reference {} ({} KiB of KV cache)",
        reference_spec.canonical(model.dtype),
        result.reference_cache_bytes / 1024
    );
    let mut mean_kld = Vec::new();
    for report in &reports {
        let stats = report
            .stats
            .as_ref()
            .context("a candidate without KLD statistics")?;
        println!(
            "{:<32} mean KLD {:.5} | same top {:5.1}% | {:5} KiB | {}",
            report.canonical,
            stats.mean_kld,
            stats.same_top_percent,
            report.kv_cache_bytes.unwrap_or(0) / 1024,
            report.band
        );
        mean_kld.push(stats.mean_kld);
    }
    // Fewer bits, more divergence: 8-bit keys and values beat 4-bit ones.
    ensure!(
        mean_kld[0] < mean_kld[1],
        "q8_0 diverges more than q4_0: {mean_kld:?}"
    );

    let smallest_excellent = reports
        .iter()
        .filter(|r| r.band == "EXCELLENT")
        .min_by_key(|r| r.kv_cache_bytes);
    match smallest_excellent {
        Some(r) => println!("smallest EXCELLENT cache: {}", r.canonical),
        None => println!("no candidate is EXCELLENT"),
    }
    Ok(())
}
