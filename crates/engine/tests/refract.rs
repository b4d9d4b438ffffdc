//! REFRACT (refract-llm 0.3.2.3) scoring through our backend package
//! `python/refract-gemma-mlx` and `gemma-mlx worker`, on the default model:
//! `refract-gemma-mlx score` writes REFRACT's JSON and HTML reports whose KLD
//! equals `gemma-mlx kld`'s on the same chunks and whose trajectory
//! agreement equals `gemma-mlx trajectory`'s on the same prompts, both
//! sides run with the same settings (the CPU's default path: GGUF blocks as
//! stored, 8-bit activations) on each CPU kernel family this CPU runs, and
//! REFRACT's report names them; `selftest` passes; REFRACT's own test suite
//! passes with the backend registered. `cargo xtask setup` installs both packages into the reference
//! environment; `GEMMA_MLX_SKIP_PARITY=1` skips these tests with it.

mod kld_cli;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kld_cli::{candidate, model, num, report_with, temp_file, CORPUS, NATIVE};
use mlx_core::block_dot::CpuKernels;
use serde_json::Value;

const REFERENCE: &str = "ctk=f16,ctv=f16";
const CANDIDATE: &str = "ctk=q8_0,ctv=q4_0";

/// The reference environment's `bin` folder, or `None` when told to skip.
fn venv_bin() -> Option<PathBuf> {
    if std::env::var("GEMMA_MLX_SKIP_PARITY").is_ok_and(|v| v == "1") {
        println!("SKIPPED: GEMMA_MLX_SKIP_PARITY=1, REFRACT not run");
        return None;
    }
    let python = std::env::var_os("GEMMA_MLX_PYTHON").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/py/venv/bin/python"),
        PathBuf::from,
    );
    let bin = python
        .parent()
        .expect("the interpreter's folder")
        .to_path_buf();
    assert!(
        bin.join("refract-gemma-mlx").is_file(),
        "{} has no refract-gemma-mlx: run `cargo xtask setup`",
        bin.display()
    );
    Some(bin)
}

/// Runs a program of the reference environment with our binary as the
/// backend's, its workers run with the model settings `NATIVE` on the CPU
/// kernel family `family`, as our own commands are run here.
fn run(bin: &Path, family: CpuKernels, program: &str, args: &[&str]) -> Output {
    let out = Command::new(bin.join(program))
        .args(args)
        .env("GEMMA_MLX_BIN", env!("CARGO_BIN_EXE_gemma-mlx"))
        .env("GEMMA_MLX_ARGS", NATIVE.join(" "))
        .env("GEMMA_MLX_CPU_KERNELS", family.name())
        .env_remove("REFRACT_BACKEND")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The first `n` of REFRACT's bundled prompts, as JSON objects.
fn bundled_prompts(bin: &Path, n: usize) -> Vec<Value> {
    let out = run(
        bin,
        CpuKernels::Portable,
        "python",
        &[
            "-c",
            "import importlib.resources as r; \
             print(r.files('refract').joinpath('prompts/v0.1.jsonl').read_text())",
        ],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .map(|l| serde_json::from_str(l).expect("a prompt line"))
        .collect()
}

fn lines(values: &[Value]) -> String {
    values.iter().map(|v| format!("{v}\n")).collect()
}

/// REFRACT's score of `CANDIDATE` on `family`: both axes (KLD over 2
/// chunks, trajectories of `prompts`), or the trajectories alone.
fn score(bin: &Path, family: CpuKernels, prompts: &Path, kld: bool) -> (Value, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (json_out, html_out) = (
        dir.path().join("report.json"),
        dir.path().join("report.html"),
    );
    let model = model();
    let (prompts, json, html) = (
        prompts.display().to_string(),
        json_out.display().to_string(),
        html_out.display().to_string(),
    );
    let mut args = vec![
        "score",
        "--model",
        &model,
        "--reference",
        REFERENCE,
        "--candidate",
        CANDIDATE,
        "--corpus",
        CORPUS,
        "--chunks",
        "2",
        "--prompts",
        &prompts,
        "--n-predict",
        "32",
        "--json-out",
        &json,
        "--html-out",
        &html,
        "--no-progress",
    ];
    if !kld {
        args.push("--skip-kld");
    }
    run(bin, family, "refract-gemma-mlx", &args);
    let refract: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_out).expect("the JSON report"))
            .expect("JSON");
    let html = std::fs::read_to_string(&html_out).expect("the HTML report");
    (refract, html)
}

#[test]
fn a_refract_score_equals_our_own_kld_and_trajectory() {
    let Some(bin) = venv_bin() else { return };
    let prompts = bundled_prompts(&bin, 4);
    let (_dir, prompts_file) = temp_file("prompts.jsonl", &lines(&prompts));
    // REFRACT applies the chat template to each prompt; ours is told to.
    let chat: Vec<Value> = prompts
        .iter()
        .map(|p| serde_json::json!({"prompt": p["prompt"], "chat": true}))
        .collect();
    let (_chat_dir, chat_file) = temp_file("chat.jsonl", &lines(&chat));
    let best = CpuKernels::best().unwrap();
    for family in CpuKernels::supported().unwrap() {
        // Both axes on the widest family; the trajectories alone (the axis
        // the kernel family moves: prompt chunks of 512 tokens take the
        // dequantized matrices in every family) on the others.
        let both_axes = family == best;
        let (refract, html) = score(&bin, family, &prompts_file, both_axes);
        assert!(html.contains("REFRACT") && html.len() > 10_000);
        let environment = &refract["environment"];
        assert_eq!(environment["backend"], "gemma-mlx");
        assert_eq!(environment["weights"], "native", "{environment}");
        assert_eq!(environment["activations"], "int8", "{environment}");
        assert_eq!(environment["cpu_kernels"], family.name(), "{environment}");
        assert_eq!(environment["kld_chunk_start"], "<bos>", "{environment}");
        let composite = num(&refract, "composite");
        println!(
            "REFRACT {CANDIDATE} on {family}: composite {composite:.2}, band {}, axes {}",
            refract["band"], refract["composite_detail"]
        );
        assert!((0.0..=100.0).contains(&composite));

        if both_axes {
            // KLD: REFRACT's axis against our command on the same 2 × 512
            // chunks.
            let kld = &refract["axes"]["kld"];
            let ours = report_with(
                &NATIVE,
                Some(family.name()),
                "kld",
                &[
                    "--corpus", CORPUS, "--ref", REFERENCE, "--cand", CANDIDATE, "--ctx", "512",
                    "--chunks", "2",
                ],
            );
            let ours = candidate(&ours, 0);
            let (theirs_kld, our_kld) = (num(kld, "mean_kld"), num(ours, "mean_kld"));
            assert!(
                ((theirs_kld - our_kld) / our_kld).abs() < 1e-6,
                "{family}: REFRACT's KLD {theirs_kld} against ours {our_kld}"
            );
            assert_eq!(num(kld, "same_topp_pct"), num(ours, "same_top_percent"));
        }

        // Trajectory: REFRACT's per-prompt agreement against our command's.
        let ours = report_with(
            &NATIVE,
            Some(family.name()),
            "trajectory",
            &[
                "--prompts",
                &chat_file.display().to_string(),
                "--ref",
                REFERENCE,
                "--cand",
                CANDIDATE,
                "--max-tokens",
                "32",
            ],
        );
        let our_prefixes: Vec<f64> = candidate(&ours, 0)["trajectories"]
            .as_array()
            .expect("trajectories")
            .iter()
            .map(|t| num(t, "common_prefix"))
            .collect();
        let their_prefixes: Vec<f64> = refract["axes"]["gtm"]["per_prompt"]
            .as_array()
            .expect("per-prompt trajectories")
            .iter()
            .map(|t| num(t, "prefix_agreement_length"))
            .collect();
        println!("{family}: per-prompt agreement {our_prefixes:?}");
        assert_eq!(their_prefixes, our_prefixes, "{family}");
    }
}

#[test]
fn refract_scores_a_kv_policy_as_our_kld_does() {
    let Some(bin) = venv_bin() else { return };
    // REFRACT splits a spec at its commas and keeps the last `ctk=`: the
    // part's settings are joined by `+` so the string reaches us whole.
    let policy = "ctk=turbo3,ctv=turbo3;global:ctk=q8_0+ctv=q8_0";
    let dir = tempfile::tempdir().expect("temp dir");
    let json_out = dir.path().join("report.json");
    let (model, json) = (model(), json_out.display().to_string());
    let family = CpuKernels::best().unwrap();
    run(
        &bin,
        family,
        "refract-gemma-mlx",
        &[
            "score",
            "--model",
            &model,
            "--reference",
            REFERENCE,
            "--candidate",
            policy,
            "--corpus",
            CORPUS,
            "--chunks",
            "2",
            "--skip-gtm",
            "--json-out",
            &json,
            "--no-progress",
        ],
    );
    let refract: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_out).expect("the JSON report"))
            .expect("JSON");
    let ours = report_with(
        &NATIVE,
        Some(family.name()),
        "kld",
        &[
            "--corpus", CORPUS, "--ref", REFERENCE, "--cand", policy, "--ctx", "512", "--chunks",
            "2",
        ],
    );
    let ours = candidate(&ours, 0);
    assert_eq!(
        ours["canonical"],
        "ctk=turbo3,ctv=turbo3,start=0;5:ctk=q8_0,ctv=q8_0;11:ctk=q8_0,ctv=q8_0;\
         17:ctk=q8_0,ctv=q8_0"
    );
    let (theirs, our) = (
        num(&refract["axes"]["kld"], "mean_kld"),
        num(ours, "mean_kld"),
    );
    println!("REFRACT's KLD of {policy}: {theirs}, ours {our}");
    assert!(
        ((theirs - our) / our).abs() < 1e-6,
        "{theirs} against {our}"
    );
}

#[test]
fn refract_selftest_passes_with_gemma_mlx() {
    let Some(bin) = venv_bin() else { return };
    let out = run(
        &bin,
        CpuKernels::best().unwrap(),
        "refract-gemma-mlx",
        &["selftest", "--model", &model()],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Backend: gemma-mlx"), "{text}");
    assert!(text.contains("generation works"), "{text}");
    assert!(text.contains("selftest passed"), "{text}");
}

#[test]
fn refracts_own_tests_pass_with_the_backend_registered() {
    let Some(bin) = venv_bin() else { return };
    let out = run(
        &bin,
        CpuKernels::best().unwrap(),
        "python",
        &[
            "-c",
            "import sys, pytest, refract_gemma_mlx; \
             sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--pyargs', 'refract.tests']))",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let summary = text.lines().last().unwrap_or_default();
    println!("REFRACT's tests: {summary}");
    assert!(
        summary.contains("passed") && !summary.contains("failed"),
        "{text}"
    );
}
