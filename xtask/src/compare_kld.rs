//! `compare-kld`: the KLD of every KV spec both engines know, ours beside
//! the TurboQuant fork's `llama-perplexity --kl-divergence`, on the same
//! GGUF file (the default model, or with `--f32-weights` its F32 copy made
//! by the fork's `llama-quantize`), corpus (the shipped essays), chunks and
//! convention: `<bos>` at each chunk's start, the second half of each
//! chunk scored, against an f16 KV cache. Ours runs twice per spec: as is,
//! and with `attn=llama-cpu` (queries rounded as llama.cpp's CPU flash
//! attention rounds them). The fork is built once under `target/llama-fork/`
//! and run with `TURBO_LAYER_ADAPTIVE=0` (its plain formats). Writes
//! `target/compare-kld/report.md` and `report.json`.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::command;
use crate::llama_build::{self, FORK};
use crate::llama_perplexity::{ours_means, Mean, Perplexity, CTX};
use crate::mlx_build::Backend;
use crate::model::MODEL_FILE;
use crate::setup::{self, SetupOptions};
use crate::test_all::cargo;
use crate::workspace::Workspace;

/// The (keys, values) types compared by default: f16 itself (the fork's
/// floor: llama-perplexity keeps the reference's log-probabilities as 16-bit
/// integers, ours are exact, so ours is 0), every llama.cpp block type and
/// TurboQuant width on both sides, and the mixed specs people use.
pub const DEFAULT_SPECS: [(&str, &str); 15] = [
    ("f16", "f16"),
    ("q8_0", "q8_0"),
    ("q5_1", "q5_1"),
    ("q5_0", "q5_0"),
    ("q4_1", "q4_1"),
    ("q4_0", "q4_0"),
    ("iq4_nl", "iq4_nl"),
    ("turbo4", "turbo4"),
    ("turbo3", "turbo3"),
    ("turbo2", "turbo2"),
    ("turbo4", "f16"),
    ("f16", "turbo4"),
    ("q8_0", "turbo4"),
    ("q8_0", "turbo2"),
    ("turbo4", "q8_0"),
];

/// What to compare.
pub struct CompareOptions {
    /// Chunks of 512 tokens (at most what the corpus holds).
    pub chunks: usize,
    /// `KEYS/VALUES` pairs; empty for [`DEFAULT_SPECS`].
    pub specs: Vec<String>,
    /// Both engines on an F32 copy of the model, so that no weight product
    /// quantizes its activations (llama.cpp's products with Q4_K and Q6_K
    /// weights quantize them to 8 bits, which turns any change of the
    /// attention output into a floor of about 0.0065 nats on this model).
    pub f32_weights: bool,
}

/// One spec's row.
#[derive(Debug, Serialize)]
struct Row {
    keys: String,
    values: String,
    fork: Mean,
    ours: Mean,
    /// Ours with `attn=llama-cpu`.
    ours_llama_queries: Mean,
    /// Ours over the fork's.
    ratio: f64,
    /// Ours with `attn=llama-cpu` over the fork's.
    ratio_llama_queries: f64,
}

/// The whole comparison.
#[derive(Debug, Serialize)]
struct Report {
    model: String,
    corpus: String,
    ctx: usize,
    chunks: usize,
    convention: &'static str,
    fork: &'static str,
    cpu: String,
    rows: Vec<Row>,
}

/// Runs the comparison.
pub fn run(workspace: &Workspace, options: &CompareOptions) -> Result<()> {
    setup::run(
        workspace,
        &SetupOptions {
            backend: Backend::Cpu,
            force: false,
            model: true,
            reference: false,
            provision: true,
        },
    )?;
    let specs = specs(&options.specs)?;
    command::run(cargo(workspace).args([
        "build",
        "--release",
        "--package",
        "engine",
        "--bin",
        "gemma-mlx",
    ]))?;
    let ours = workspace.root().join("target/release/gemma-mlx");
    let bin = llama_build::ensure_built(workspace, &FORK, &["llama-perplexity", "llama-quantize"])?;
    let perplexity = bin.join("llama-perplexity");
    let out = workspace.root().join("target/compare-kld");
    fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let shipped = workspace.model_root().join(MODEL_FILE);
    let model = if options.f32_weights {
        f32_copy(&bin.join("llama-quantize"), &shipped, &out)?
    } else {
        shipped
    };
    let corpus = workspace
        .root()
        .join("crates/gemma/tests/fixtures/text/essays.txt");
    let fork = Perplexity {
        binary: &perplexity,
        model: &model,
        chunks: options.chunks,
        threads: llama_build::threads(),
        base: out.join("base.kld"),
    };
    fork.write_base(&corpus)?;
    let mut fork_means = Vec::new();
    for (k, v) in &specs {
        fork_means.push(fork.mean(k, v)?);
    }
    let candidates: Vec<String> = ["exact", "llama-cpu"]
        .iter()
        .flat_map(|attn| {
            specs
                .iter()
                .map(move |(k, v)| format!("ctk={k},ctv={v},attn={attn}"))
        })
        .collect();
    let our_means = ours_means(&ours, &model, &corpus, options.chunks, &candidates)?;
    let (exact, llama_queries) = our_means.split_at(specs.len());
    let rows: Vec<Row> = specs
        .iter()
        .zip(fork_means)
        .zip(exact.iter().zip(llama_queries))
        .map(|(((k, v), fork), (&ours, &ours_llama_queries))| Row {
            keys: k.clone(),
            values: v.clone(),
            fork,
            ours,
            ours_llama_queries,
            ratio: ours.kld / fork.kld,
            ratio_llama_queries: ours_llama_queries.kld / fork.kld,
        })
        .collect();
    let report = Report {
        model: model.display().to_string(),
        corpus: corpus.display().to_string(),
        ctx: CTX,
        chunks: options.chunks,
        convention: "<bos> at each chunk's start, second half of each chunk scored, \
                     reference ctk=f16,ctv=f16",
        fork: FORK.name,
        cpu: cpu_name(),
        rows,
    };
    let markdown = markdown(&report);
    print!("{markdown}");
    fs::write(out.join("report.md"), &markdown)?;
    fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!("compare-kld: wrote {}", out.join("report.md").display());
    Ok(())
}

/// The F32 copy of `model` in `out`, made by the fork's `llama-quantize`
/// unless it is there.
fn f32_copy(quantize: &Path, model: &Path, out: &Path) -> Result<PathBuf> {
    let copy = out.join("model-f32.gguf");
    if !copy.is_file() {
        let mut c = Command::new(quantize);
        c.arg("--allow-requantize").arg(model).arg(&copy).arg("F32");
        println!("$ {}", command::describe(&c));
        command::stdout_of(&mut c)?;
    }
    Ok(copy)
}

/// `KEYS/VALUES` pairs, checked, or the defaults.
fn specs(given: &[String]) -> Result<Vec<(String, String)>> {
    if given.is_empty() {
        return Ok(DEFAULT_SPECS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect());
    }
    given
        .iter()
        .map(|s| {
            let (k, v) = s
                .split_once('/')
                .with_context(|| format!("spec '{s}' is not KEYS/VALUES (e.g. q8_0/turbo4)"))?;
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

/// The CPU's model name from /proc/cpuinfo.
fn cpu_name() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The report as a Markdown table.
fn markdown(r: &Report) -> String {
    let mut out = format!(
        "# KLD against an f16 KV cache: gemma-mlx beside {}\n\n{}; {} chunks of {} tokens of {}, {}; {}.\n\n\
         | keys / values | fork mean KLD | ours | ours / fork | ours, `attn=llama-cpu` | that / fork | same top % (fork, ours) |\n\
         |---|---|---|---|---|---|---|\n",
        r.fork, r.model, r.chunks, r.ctx, r.corpus, r.convention, r.cpu
    );
    let ratio = |ratio: f64, fork: f64| {
        if ratio.is_finite() && fork > 0.0 {
            format!("{ratio:.2}")
        } else {
            "–".into()
        }
    };
    for row in &r.rows {
        let _ = writeln!(
            out,
            "| {} / {} | {:.5} ± {:.5} | {:.5} ± {:.5} | {} | {:.5} ± {:.5} | {} | {:.2}, {:.2} |",
            row.keys,
            row.values,
            row.fork.kld,
            row.fork.error,
            row.ours.kld,
            row.ours.error,
            ratio(row.ratio, row.fork.kld),
            row.ours_llama_queries.kld,
            row.ours_llama_queries.error,
            ratio(row.ratio_llama_queries, row.fork.kld),
            row.fork.same_top_percent,
            row.ours.same_top_percent
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_keys_slash_values() {
        let s = specs(&["q8_0/turbo4".into()]).unwrap();
        assert_eq!(s, vec![("q8_0".to_string(), "turbo4".to_string())]);
        assert!(specs(&["q8_0".into()]).is_err());
        assert_eq!(specs(&[]).unwrap().len(), DEFAULT_SPECS.len());
    }
}
