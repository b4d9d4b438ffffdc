//! `target/bench/report.md` and `report.json`, and the table on stdout.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::bench::engines::RunOutput;
use crate::bench::llamacpp::{LlamaComparison, LlamaOutcome, GENERATED, PROMPT};
use crate::bench::perplexity::SweepComparison;
use crate::bench::plan::{case_name, Kv};
use crate::bench::stats::{common_prefix, median, median_of, row, Figure, Row};
use crate::bench::{Measured, CHART_CONTEXTS, CHART_TOKENS, PROMPT_CASES, SHIPPED_CASE};

/// How far the two engines' greedy tokens agree on one case.
#[derive(Clone, Debug, Serialize)]
pub struct Agreement {
    /// The case.
    pub case: String,
    /// Tokens both generated.
    pub tokens: usize,
    /// Leading tokens that are the same.
    pub same_prefix: usize,
}

/// Wall-clock seconds of the KLD sweep, both methods.
#[derive(Clone, Debug, Serialize)]
pub struct KldTiming {
    /// The candidate KV specs.
    pub candidates: Vec<String>,
    /// Chunks of 512 tokens scored.
    pub chunks: usize,
    /// One reference forward per chunk, shared by the candidates.
    pub one_pass_s: f64,
    /// The existing tool's method: the reference again for every candidate.
    pub two_forwards_s: f64,
    /// One process of one thread (the 1-rank figure of the data-parallel
    /// comparison).
    pub one_rank_s: f64,
    /// Two ranks of one thread each, started by `mlx.launch` (ring).
    pub two_ranks_s: f64,
    /// Two ranks of one thread each, started with MLX's ring environment
    /// directly (no launcher polling beside them).
    pub two_ranks_direct_s: f64,
}

/// Compares the first round's token ids case by case. Unquantized cases
/// must agree exactly (else the speed comparison is void, and this fails);
/// quantized ones are reported (the engines quantize the same layers, but
/// not bit for bit the same way).
pub fn agreement(ours: &[RunOutput], theirs: &[RunOutput]) -> Result<Vec<Agreement>> {
    let (Some(ours), Some(theirs)) = (ours.first(), theirs.first()) else {
        return Ok(Vec::new());
    };
    let mut agreements = Vec::new();
    for mine in &ours.results {
        let Some(other) = theirs.case(&mine.name) else {
            bail!("mlx-lm has no result for case '{}'", mine.name);
        };
        let agreement = Agreement {
            case: mine.name.clone(),
            tokens: mine.token_ids.len().min(other.token_ids.len()),
            same_prefix: common_prefix(&mine.token_ids, &other.token_ids),
        };
        let exact = agreement.same_prefix == mine.token_ids.len()
            && mine.token_ids.len() == other.token_ids.len();
        if mine.name.ends_with(Kv::Plain.name()) && !exact {
            bail!(
                "the engines' greedy tokens differ on case '{}' (same for the first {} of {} \
                 tokens): a speed comparison of different computations is void.\n  ours:   \
                 {:?}\n  mlx-lm: {:?}",
                mine.name,
                agreement.same_prefix,
                agreement.tokens,
                mine.token_ids,
                other.token_ids
            );
        }
        agreements.push(agreement);
    }
    Ok(agreements)
}

/// The same-settings rows.
fn same_rows(m: &Measured) -> Vec<Row> {
    let (ours, theirs) = (&m.same_ours, &m.same_mlx_lm);
    let mut rows = Vec::new();
    for kv in Kv::ALL {
        for (prompt, generated) in PROMPT_CASES {
            let name = case_name(prompt, generated, kv);
            let label = format!("prompt tok/s, {prompt}-token prompt");
            rows.push(row(
                &label,
                kv.name(),
                &name,
                Figure::PromptTps,
                ours,
                theirs,
            ));
            let label = format!("time to first token (s), {prompt}-token prompt");
            rows.push(row(&label, kv.name(), &name, Figure::Ttft, ours, theirs));
        }
        let (prompt, generated) = PROMPT_CASES[0];
        let name = case_name(prompt, generated, kv);
        let label = format!("generation tok/s, {generated} tokens after {prompt}");
        rows.push(row(
            &label,
            kv.name(),
            &name,
            Figure::GenerationTps,
            ours,
            theirs,
        ));
        let label = format!("peak memory (MiB), {prompt} + {generated}");
        rows.push(row(&label, kv.name(), &name, Figure::PeakMib, ours, theirs));
    }
    for context in CHART_CONTEXTS {
        let name = case_name(context, CHART_TOKENS, Kv::Plain);
        let label = format!("generation tok/s, {CHART_TOKENS} tokens after {context}");
        rows.push(row(
            &label,
            "plain",
            &name,
            Figure::GenerationTps,
            ours,
            theirs,
        ));
    }
    rows
}

/// The as-shipped rows.
fn shipped_rows(m: &Measured) -> Vec<Row> {
    let (ours, theirs) = (&m.shipped_ours, &m.shipped_mlx_lm);
    let (prompt, generated) = SHIPPED_CASE;
    let name = case_name(prompt, generated, Kv::Plain);
    [
        (
            format!("prompt tok/s, {prompt}-token prompt"),
            Figure::PromptTps,
        ),
        (
            format!("generation tok/s, {generated} tokens"),
            Figure::GenerationTps,
        ),
        ("time to first token (s)".to_owned(), Figure::Ttft),
        ("peak memory (MiB)".to_owned(), Figure::PeakMib),
    ]
    .iter()
    .map(|(label, figure)| row(label, "plain", &name, *figure, ours, theirs))
    .collect()
}

fn number(value: Option<f64>) -> String {
    match value {
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.3}"),
        None => "–".to_owned(),
    }
}

fn table(rows: &[Row]) -> String {
    let mut text = String::from(
        "| metric | KV cache | gemma-mlx | mlx-lm | ratio (ours / mlx-lm) |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        let better = if r.higher_is_better { "↑" } else { "↓" };
        let _ = writeln!(
            text,
            "| {} {better} | {} | {} | {} | {} |",
            r.metric,
            r.kv,
            number(r.ours),
            number(r.mlx_lm),
            r.ratio.map_or("–".to_owned(), |x| format!("{x:.2}×"))
        );
    }
    text
}

/// Writes the report files and prints the markdown.
pub fn write(out: &Path, m: &Measured, seconds: f64) -> Result<()> {
    let same = same_rows(m);
    let shipped = shipped_rows(m);
    let mut md = String::from("# gemma-mlx against mlx-lm 0.32.2\n\n");
    let _ = writeln!(
        md,
        "Default model (Gemma 3 270M), CPU, medians of {} alternating rounds; greedy, with \
         `<eos>` (1) and `<end_of_turn>` (106) biased away on both sides so that every \
         generation runs to its length. ↑: higher is better, ↓: lower is better. \
         The bench took {seconds:.0} s.\n",
        m.same_ours.len()
    );
    let _ = writeln!(
        md,
        "## Same settings\n\nmlx-lm: {}; weights converted to float32 safetensors by \
         `gemma-mlx convert`. Ours: float32, the same libmlx and OpenBLAS.\n",
        m.reference_env
    );
    if let Some(error) = m.same_mlx_lm.first().and_then(|r| r.kv_bits_error.as_ref()) {
        let _ = writeln!(
            md,
            "KV quantization: mlx-lm's own `kv_bits=` fails on Gemma 3 (`{error}`: its \
             sliding-window layers use a `RotatingKVCache`), so both engines quantize only the \
             3 global layers (a `QuantizedKVCache` from the first token); the 15 sliding-window \
             layers keep float caches.\n"
        );
    }
    md.push_str(&table(&same));
    md.push_str("\nGreedy-token agreement (first round):\n\n");
    for a in &m.agreement {
        let _ = writeln!(
            md,
            "- {}: {} of {} tokens the same",
            a.case, a.same_prefix, a.tokens
        );
    }
    if let Some(env) = &m.shipped_env {
        let _ = writeln!(
            md,
            "\n## As shipped\n\nmlx-lm: {env}, bfloat16 weights, the wheel's bundled BLAS. \
             Ours: defaults (float32, OpenBLAS).\n"
        );
        md.push_str(&table(&shipped));
    }
    if let Some(points) = &m.flatness {
        md.push_str(
            "\n## Memory flatness (ours)\n\nActive memory beyond weights and KV cache:\n\n",
        );
        for p in points.as_array().map_or(&[][..], Vec::as_slice) {
            let _ = writeln!(
                md,
                "- after {} decoded tokens: {:.2} MiB",
                p["decoded_tokens"],
                p["other_bytes"].as_f64().unwrap_or(f64::NAN) / (1u64 << 20) as f64
            );
        }
    }
    if let Some(kld) = &m.kld {
        let _ = writeln!(
            md,
            "\n## KLD sweep\n\n{} candidates ({}), {} chunks of 512 tokens: {:.1} s with one \
             reference pass per chunk, {:.1} s with the two-forwards method: {:.2}× faster.",
            kld.candidates.len(),
            kld.candidates.join("; "),
            kld.chunks,
            kld.one_pass_s,
            kld.two_forwards_s,
            kld.two_forwards_s / kld.one_pass_s
        );
        let _ = writeln!(
            md,
            "\nSpread over ranks (ring backend, one thread a rank): {:.1} s on one rank; on \
             two, {:.1} s started by `mlx.launch -n 2` ({:.2}× faster; the launcher polls \
             without waiting) and {:.1} s started with MLX's ring environment directly \
             ({:.2}×). Each process loads the model; one process of two threads: {:.1} s.",
            kld.one_rank_s,
            kld.two_ranks_s,
            kld.one_rank_s / kld.two_ranks_s,
            kld.two_ranks_direct_s,
            kld.one_rank_s / kld.two_ranks_direct_s,
            kld.one_pass_s
        );
    }
    match &m.llama_cpp {
        Some(LlamaOutcome::Measured(llama)) => md.push_str(&llama_section(llama)),
        Some(LlamaOutcome::Failed { error }) => {
            let _ = write!(
                md,
                "\n## llama.cpp, same GGUF file\n\nThe comparison failed: {error}\n"
            );
        }
        None => {}
    }
    let chart: Vec<(usize, Option<f64>, Option<f64>)> = CHART_CONTEXTS
        .iter()
        .map(|&c| {
            let name = case_name(c, CHART_TOKENS, Kv::Plain);
            (
                c,
                median_of(&m.same_ours, &name, Figure::GenerationTps),
                median_of(&m.same_mlx_lm, &name, Figure::GenerationTps),
            )
        })
        .collect();
    let json = serde_json::json!({
        "seconds": seconds,
        "same_settings": same,
        "as_shipped": shipped,
        "generation_tps_by_context": chart,
        "measured": m,
    });
    let md_path = out.join("report.md");
    let json_path = out.join("report.json");
    fs::write(&md_path, &md).with_context(|| format!("cannot write {}", md_path.display()))?;
    fs::write(&json_path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    println!(
        "\n{md}\nwrote {} and {}",
        md_path.display(),
        json_path.display()
    );
    Ok(())
}

/// The llama.cpp section: medians per engine and ours against llama.cpp.
fn llama_section(l: &LlamaComparison) -> String {
    let mid = |values: &[f64]| median(values).unwrap_or(f64::NAN);
    let mut md = format!(
        "\n## llama.cpp, same GGUF file\n\nllama.cpp {} built here with `GGML_NATIVE=ON` (no AMX), \
         `llama-bench -p {PROMPT} -n {GENERATED} -t {}`, against `gemma-mlx generate \
         --synthetic-prompt {PROMPT} --max-tokens {GENERATED}`; medians of {} alternating \
         rounds, peak resident memory from GNU time.\n\n\
         | engine | prompt tok/s ↑ | generation tok/s ↑ | peak RSS MiB ↓ | prompt / llama.cpp | \
         generation / llama.cpp |\n|---|---|---|---|---|---|\n",
        l.commit,
        l.threads,
        l.engines.first().map_or(0, |e| e.generation_tps.len())
    );
    let (bp, bg) = l.engines.first().map_or((f64::NAN, f64::NAN), |b| {
        (mid(&b.prompt_tps), mid(&b.generation_tps))
    });
    for e in &l.engines {
        let (p, g, r) = (
            mid(&e.prompt_tps),
            mid(&e.generation_tps),
            mid(&e.peak_rss_mib),
        );
        let _ = writeln!(
            md,
            "| {} | {p:.1} | {g:.2} | {r:.0} | {:.2}× | {:.2}× |",
            e.engine,
            p / bp,
            g / bg
        );
    }
    if let Some(sweep) = &l.kld_sweep_vs_llama_perplexity {
        md.push_str(&sweep_line(sweep));
    }
    md
}

/// The KLD sweep beside llama-perplexity, in one paragraph.
fn sweep_line(s: &SweepComparison) -> String {
    let mut md = format!(
        "\nKLD sweep, `{}` against an f16 cache, {} chunks of {} tokens, second halves scored \
         (`gemma-mlx kld --second-half`; llama-perplexity's reference run with \
         `--kl-divergence-base`, then its candidate run, each loading the model): ours {:.1} s, \
         llama-perplexity {:.1} s: **{:.2}×** its speed (medians of {} rounds); mean KLD \
         {:.6} and {:.6}.\n",
        s.candidate,
        s.chunks,
        s.ctx,
        s.ours_seconds,
        s.llama_perplexity_seconds,
        s.llama_perplexity_seconds / s.ours_seconds,
        s.ours_rounds.len(),
        s.ours_mean_kld,
        s.llama_perplexity_mean_kld
    );
    if let Some(error) = &s.error {
        let _ = writeln!(md, "\nThe sweep's rounds stopped: {error}");
    }
    md
}
