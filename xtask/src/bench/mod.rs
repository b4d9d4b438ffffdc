//! `cargo xtask bench`: this engine against mlx-lm 0.32.2 on the default
//! model, in the same run, alternating, then against llama.cpp on the same
//! GGUF file (`llamacpp.rs`); see `report.rs` for what it writes.
//!
//! Two comparisons. Same settings: mlx-lm in `target/py/venv` (MLX 0.32.4,
//! OpenBLAS), float32 weights converted from the default model, against our
//! float32. As shipped: mlx-lm in `target/py/venv-shipped` (`pip install
//! 'mlx[cpu]' mlx-lm`, the wheel's reference BLAS), bfloat16 weights, against
//! our defaults.

mod engines;
mod llamacpp;
mod perplexity;
mod plan;
mod report;
mod scratch;
mod stats;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::command;
use crate::llama_build;
use crate::llama_perplexity::Perplexity;
use crate::mlx_build::Backend;
use crate::mlx_lm_env::{self, Flavor};
use crate::setup::{self, SetupOptions};
use crate::test_all::cargo;
use crate::workspace::Workspace;

use engines::{Engine, RunOutput};
use perplexity::SweepRuns;
use plan::{case_name, Case, Kv, Plan};

/// What `bench` should do.
pub struct BenchOptions {
    /// Rounds of the same-settings comparison (each runs both engines).
    pub rounds: usize,
    /// Rounds of the as-shipped comparison (0 skips it).
    pub shipped_rounds: usize,
    /// Measure memory flatness over 1,000 and 4,000 decoded tokens.
    pub flatness: bool,
    /// Chunks of the KLD sweep, also of the sweep beside llama-perplexity
    /// (0 skips both).
    pub kld_chunks: usize,
    /// Rounds of the comparison with llama.cpp (0 skips it and its build).
    pub llama_rounds: usize,
}

/// Prompt lengths of the prompt-speed cases, and tokens generated after them.
const PROMPT_CASES: [(usize, usize); 2] = [(512, 256), (2048, 4)];
/// Context lengths of the chart, and tokens decoded after each.
const CHART_CONTEXTS: [usize; 3] = [128, 512, 2048];
const CHART_TOKENS: usize = 64;
/// The as-shipped case: prompt length and generated tokens.
const SHIPPED_CASE: (usize, usize) = (512, 32);
/// Decoded-token marks of the memory-flatness figure.
const FLATNESS_MARKS: &str = "1000,4000";
/// The KLD sweep's candidates.
const KLD_CANDIDATES: [&str; 4] = [
    "ctk=q8_0,ctv=q8_0",
    "ctk=q5_1,ctv=q5_1",
    "ctk=q4_0,ctv=q4_0",
    "ctk=q8_0,ctv=q4_0",
];

/// Everything one bench run measured.
#[derive(Debug, Serialize)]
pub struct Measured {
    same_ours: Vec<RunOutput>,
    same_mlx_lm: Vec<RunOutput>,
    shipped_ours: Vec<RunOutput>,
    shipped_mlx_lm: Vec<RunOutput>,
    shipped_env: Option<String>,
    reference_env: String,
    agreement: Vec<report::Agreement>,
    flatness: Option<serde_json::Value>,
    kld: Option<report::KldTiming>,
    llama_cpp: Option<llamacpp::LlamaOutcome>,
}

/// Runs the benchmark and writes `target/bench/report.{md,json}`.
pub fn run(workspace: &Workspace, options: &BenchOptions) -> Result<()> {
    let started = Instant::now();
    setup::run(
        workspace,
        &SetupOptions {
            backend: Backend::Cpu,
            force: false,
            model: true,
            reference: true,
            provision: true,
        },
    )?;
    let reference = mlx_lm_env::ensure(workspace, Flavor::Reference, false)?;
    command::run(cargo(workspace).args([
        "build",
        "--release",
        "--package",
        "engine",
        "--bin",
        "gemma-mlx",
    ]))?;
    let binary = workspace.root().join("target/release/gemma-mlx");
    let out = workspace.root().join("target/bench");
    fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let script = workspace.root().join("xtask/bench/mlx_lm_bench.py");
    let tokens = corpus_tokens(workspace, &binary)?;

    let same_dir = convert(&binary, &out.join("hf-270m"), "float32")?;
    let ours = Engine::Ours {
        binary: binary.clone(),
        model_args: ["--dtype", "float32", "--weights", "dequantized"]
            .map(String::from)
            .to_vec(),
    };
    let theirs = Engine::MlxLm {
        python: reference.python.clone(),
        script: script.clone(),
        model_dir: same_dir,
    };
    let same_plan = write_plan(&out.join("plan-same.json"), &Plan::new(same_cases(&tokens)))?;
    let (same_ours, same_mlx_lm) =
        alternate("same settings", &ours, &theirs, &same_plan, options.rounds)?;
    let agreement = report::agreement(&same_ours, &same_mlx_lm)?;

    let (shipped_ours, shipped_mlx_lm, shipped_env) = if options.shipped_rounds > 0 {
        let shipped = mlx_lm_env::ensure(workspace, Flavor::Shipped, false)?;
        let dir = convert(&binary, &out.join("hf-270m-bf16"), "bfloat16")?;
        let (prompt, generated) = SHIPPED_CASE;
        let cases = vec![Case::new(
            case_name(prompt, generated, Kv::Plain),
            &tokens,
            prompt,
            generated,
            Kv::Plain,
        )];
        let plan = write_plan(&out.join("plan-shipped.json"), &Plan::new(cases))?;
        let defaults = Engine::Ours {
            binary: binary.clone(),
            model_args: Vec::new(),
        };
        let theirs = Engine::MlxLm {
            python: shipped.python.clone(),
            script,
            model_dir: dir,
        };
        let (a, b) = alternate(
            "as shipped",
            &defaults,
            &theirs,
            &plan,
            options.shipped_rounds,
        )?;
        (a, b, Some(shipped.to_string()))
    } else {
        (Vec::new(), Vec::new(), None)
    };

    let flatness = if options.flatness {
        Some(flatness(&ours, &out, &tokens)?)
    } else {
        None
    };
    let kld = if options.kld_chunks > 0 {
        let launcher = reference
            .python
            .parent()
            .context("the reference interpreter has no folder")?
            .join("mlx.launch");
        Some(kld(workspace, &binary, options.kld_chunks, &launcher)?)
    } else {
        None
    };
    let llama_cpp = (options.llama_rounds > 0)
        .then(|| llama_outcome(workspace, &binary, options.llama_rounds, options.kld_chunks));

    let measured = Measured {
        same_ours,
        same_mlx_lm,
        shipped_ours,
        shipped_mlx_lm,
        shipped_env,
        reference_env: reference.to_string(),
        agreement,
        flatness,
        kld,
        llama_cpp,
    };
    report::write(&out, &measured, started.elapsed().as_secs_f64())?;
    chart(workspace, &reference.python, &out)?;
    if let Some(llamacpp::LlamaOutcome::Failed { error }) = &measured.llama_cpp {
        bail!("the comparison with llama.cpp failed (the report has the rest): {error}");
    }
    Ok(())
}

/// Builds llama.cpp's `llama-bench` (once) and runs it beside `binary`
/// `rounds` times; a failure is kept as the outcome, not returned, so that
/// what the bench measured before is still written.
fn llama_outcome(
    workspace: &Workspace,
    binary: &Path,
    rounds: usize,
    sweep_chunks: usize,
) -> llamacpp::LlamaOutcome {
    let targets = ["llama-bench", "llama-perplexity"];
    let measured =
        llama_build::ensure_built(workspace, &llama_build::STOCK, &targets).and_then(|bin| {
            let model = workspace.model_root().join(crate::model::MODEL_FILE);
            let perplexity = bin.join("llama-perplexity");
            let corpus = corpus(workspace);
            let sweep = (sweep_chunks > 0).then(|| {
                let runs = Perplexity {
                    binary: &perplexity,
                    model: &model,
                    chunks: sweep_chunks,
                    threads: llama_build::threads(),
                    base: scratch::scratch_path("kld-base"),
                };
                SweepRuns::new(runs, binary, &corpus)
            });
            llamacpp::compare(&bin.join("llama-bench"), binary, &model, rounds, sweep)
        });
    match measured {
        Ok(comparison) => llamacpp::LlamaOutcome::Measured(comparison),
        Err(e) => {
            eprintln!("bench: the comparison with llama.cpp failed: {e:#}");
            llamacpp::LlamaOutcome::Failed {
                error: format!("{e:#}"),
            }
        }
    }
}

/// Draws `chart.png` (generation tok/s against context, both engines) from
/// `report.json` with matplotlib, installed into the reference environment
/// when missing.
fn chart(workspace: &Workspace, python: &Path, out: &Path) -> Result<()> {
    let has_matplotlib = command::capture(Command::new(python).args(["-c", "import matplotlib"]))?
        .status
        .success();
    if !has_matplotlib {
        command::run(
            Command::new(python)
                .args(["-m", "pip", "install", "matplotlib"])
                .env("PIP_ROOT_USER_ACTION", "ignore"),
        )?;
    }
    let script = workspace.root().join("xtask/bench/chart.py");
    let png = out.join("chart.png");
    command::run(
        Command::new(python)
            .arg(script)
            .arg(out.join("report.json"))
            .arg(&png),
    )?;
    println!("wrote {}", png.display());
    Ok(())
}

/// The benchmark text's token ids, `<bos>` first, as our tokenizer makes them.
fn corpus_tokens(workspace: &Workspace, binary: &Path) -> Result<Vec<u32>> {
    let corpus = corpus(workspace);
    let text =
        fs::read_to_string(&corpus).with_context(|| format!("cannot read {}", corpus.display()))?;
    let stdout = command::stdout_of(Command::new(binary).args(["tokenize", "--json", &text]))?;
    let value: serde_json::Value = serde_json::from_str(stdout.trim())
        .context("`gemma-mlx tokenize --json` printed no JSON")?;
    let tokens: Vec<u32> = serde_json::from_value(value["token_ids"].clone())
        .context("`gemma-mlx tokenize --json` printed no token_ids")?;
    let needed = PROMPT_CASES.iter().map(|(p, _)| *p).max().unwrap_or(0);
    if tokens.len() < needed {
        bail!(
            "{}: {} tokens, and the bench needs {needed}",
            corpus.display(),
            tokens.len()
        );
    }
    Ok(tokens)
}

/// The English text the prompts and the KLD sweep come from.
fn corpus(workspace: &Workspace) -> PathBuf {
    workspace
        .root()
        .join("crates/gemma/tests/fixtures/text/essays.txt")
}

/// The same-settings cases: prompt speed and generation with each KV
/// setting, then decoding after prompts of the chart's lengths.
fn same_cases(tokens: &[u32]) -> Vec<Case> {
    let mut cases = Vec::new();
    for kv in Kv::ALL {
        for (prompt, generated) in PROMPT_CASES {
            cases.push(Case::new(
                case_name(prompt, generated, kv),
                tokens,
                prompt,
                generated,
                kv,
            ));
        }
    }
    for context in CHART_CONTEXTS {
        cases.push(Case::new(
            case_name(context, CHART_TOKENS, Kv::Plain),
            tokens,
            context,
            CHART_TOKENS,
            Kv::Plain,
        ));
    }
    cases
}

fn write_plan(path: &Path, plan: &Plan) -> Result<PathBuf> {
    let text = serde_json::to_string(plan)?;
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path.to_owned())
}

/// The default model converted for mlx-lm in `dtype` at `dir`, reused when
/// already there.
fn convert(binary: &Path, dir: &Path, dtype: &str) -> Result<PathBuf> {
    if dir.join("model.safetensors").is_file() && dir.join("config.json").is_file() {
        println!("bench: reusing {}", dir.display());
        return Ok(dir.to_owned());
    }
    let partial = PathBuf::from(format!("{}.partial", dir.display()));
    let _ = fs::remove_dir_all(&partial);
    command::run(
        Command::new(binary)
            .args(["convert", "--dtype", dtype, "--out"])
            .arg(&partial),
    )?;
    let _ = fs::remove_dir_all(dir);
    fs::rename(&partial, dir)
        .with_context(|| format!("cannot move {} to {}", partial.display(), dir.display()))?;
    Ok(dir.to_owned())
}

/// Runs both engines `rounds` times over the plan, alternating which goes
/// first, and returns their outputs.
fn alternate(
    label: &str,
    ours: &Engine,
    theirs: &Engine,
    plan: &Path,
    rounds: usize,
) -> Result<(Vec<RunOutput>, Vec<RunOutput>)> {
    let mut mine = Vec::new();
    let mut other = Vec::new();
    for round in 0..rounds {
        let order: [(&Engine, bool); 2] = if round % 2 == 0 {
            [(ours, true), (theirs, false)]
        } else {
            [(theirs, false), (ours, true)]
        };
        for (engine, is_ours) in order {
            let who = if is_ours { "gemma-mlx" } else { "mlx-lm" };
            println!("bench: {label}, round {}/{rounds}: {who}", round + 1);
            let started = Instant::now();
            let output = engine
                .run(plan, &[])
                .with_context(|| format!("{label}: {who} failed"))?;
            println!("  {:.1} s", started.elapsed().as_secs_f64());
            if is_ours {
                mine.push(output);
            } else {
                other.push(output);
            }
        }
    }
    Ok((mine, other))
}

/// Our engine's memory beyond weights and KV cache after 1,000 and 4,000
/// decoded tokens.
fn flatness(ours: &Engine, out: &Path, tokens: &[u32]) -> Result<serde_json::Value> {
    let case = Case::new("flatness".into(), tokens, 128, 1, Kv::Plain);
    let plan = write_plan(&out.join("plan-flatness.json"), &Plan::new(vec![case]))?;
    println!("bench: memory flatness, decoding 4,000 tokens");
    let output = ours.run(&plan, &["--flatness".into(), FLATNESS_MARKS.into()])?;
    output
        .flatness
        .context("gemma-mlx bench --flatness printed no flatness figures")
}

/// Times the KLD sweep of the four candidates with and without the
/// two-forwards method, then spread over ranks: one process of one thread
/// against two ranks of one thread each (ring backend, this machine),
/// started by `launcher` (`mlx.launch`) and, apart, by this process with
/// MLX's ring environment (`mlx.launch` 0.32.4 polls each rank's pipes
/// without waiting, which takes a core of this machine's two).
fn kld(
    workspace: &Workspace,
    binary: &Path,
    chunks: usize,
    launcher: &Path,
) -> Result<report::KldTiming> {
    let corpus = corpus(workspace);
    let mut args = vec!["kld".to_owned(), "--json".to_owned(), "--chunks".to_owned()];
    args.push(chunks.to_string());
    args.push("--corpus".to_owned());
    args.push(corpus.display().to_string());
    for candidate in KLD_CANDIDATES {
        args.extend(["--cand".to_owned(), (*candidate).to_owned()]);
    }
    let timed = |run: &mut Command, world_size: u64| -> Result<f64> {
        println!("$ {}", command::describe(run));
        let started = Instant::now();
        let stdout = command::stdout_of(run)?;
        let seconds = started.elapsed().as_secs_f64();
        let written = stdout
            .lines()
            .last()
            .and_then(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .and_then(|report| report["settings"]["world_size"].as_u64());
        if written != Some(world_size) {
            bail!(
                "`{}` wrote no report of {world_size} rank(s) (mlx.launch exits 0 when a rank fails)",
                command::describe(run)
            );
        }
        Ok(seconds)
    };
    let one_pass_s = timed(Command::new(binary).args(&args), 1)?;
    let two_forwards_s = timed(Command::new(binary).args(&args).arg("--two-forwards"), 1)?;
    let one_thread = [("RAYON_NUM_THREADS", "1"), ("OPENBLAS_NUM_THREADS", "1")];
    let one_rank_s = timed(Command::new(binary).args(&args).envs(one_thread), 1)?;
    let mut ranks = Command::new(launcher);
    ranks.args(["-n", "2", "--backend", "ring"]);
    for (name, value) in one_thread {
        ranks.args(["--env", &format!("{name}={value}")]);
    }
    let two_ranks_s = timed(ranks.arg("--").arg(binary).args(&args), 2)?;
    let two_ranks_direct_s = two_ranks_direct(binary, &args, &one_thread, &timed)?;
    Ok(report::KldTiming {
        candidates: KLD_CANDIDATES.iter().map(|c| (*c).to_owned()).collect(),
        chunks,
        one_pass_s,
        two_forwards_s,
        one_rank_s,
        two_ranks_s,
        two_ranks_direct_s,
    })
}

/// Times `binary ARGS` on two ranks that this process starts with MLX's
/// ring environment (a hostfile of two loopback ports, `MLX_RANK`), rank
/// 1 in the background and rank 0 through `timed`.
fn two_ranks_direct(
    binary: &Path,
    args: &[String],
    env: &[(&str, &str)],
    timed: &dyn Fn(&mut Command, u64) -> Result<f64>,
) -> Result<f64> {
    let ports = [free_port()?, free_port()?];
    let hostfile = scratch::scratch_path("ring.json");
    let hosts: Vec<Vec<String>> = ports
        .iter()
        .map(|p| vec![format!("127.0.0.1:{p}")])
        .collect();
    fs::write(&hostfile, serde_json::to_string(&hosts)?)
        .with_context(|| format!("cannot write {}", hostfile.display()))?;
    let rank = |r: &str| {
        let mut run = Command::new(binary);
        run.args(args)
            .envs(env.iter().copied())
            .env("MLX_HOSTFILE", &hostfile)
            .env("MLX_RANK", r);
        run
    };
    let mut second = rank("1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("cannot start rank 1")?;
    let seconds = timed(&mut rank("0"), 2);
    let status = second.wait().context("waiting for rank 1")?;
    fs::remove_file(&hostfile).ok();
    let seconds = seconds?;
    if !status.success() {
        bail!("rank 1 of the directly started sweep failed ({status})");
    }
    Ok(seconds)
}

/// A loopback port nobody listens on now.
fn free_port() -> Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("cannot find a free loopback port")?;
    Ok(listener.local_addr()?.port())
}
