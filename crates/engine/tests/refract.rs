//! REFRACT (refract-llm 0.3.2.3) scoring through our backend package
//! `python/refract-gemma-mlx` and `gemma-mlx worker`, on the default model:
//! `refract-gemma-mlx score` writes REFRACT's JSON and HTML reports whose KLD
//! equals `gemma-mlx kld`'s on the same chunks and whose trajectory
//! agreement equals `gemma-mlx trajectory`'s on the same prompts;
//! `selftest` passes; REFRACT's own test suite passes with the backend
//! registered. `cargo xtask setup` installs both packages into the reference
//! environment; `GEMMA_MLX_SKIP_PARITY=1` skips these tests with it.

mod kld_cli;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kld_cli::{candidate, model, num, report, temp_file, CORPUS};
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
/// backend's, the model in float32 as the other commands here run it.
fn run(bin: &Path, program: &str, args: &[&str]) -> Output {
    let out = Command::new(bin.join(program))
        .args(args)
        .env("GEMMA_MLX_BIN", env!("CARGO_BIN_EXE_gemma-mlx"))
        .env("GEMMA_MLX_ARGS", "--dtype float32")
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

#[test]
fn a_refract_score_equals_our_own_kld_and_trajectory() {
    let Some(bin) = venv_bin() else { return };
    let prompts = bundled_prompts(&bin, 4);
    let (dir, prompts_file) = temp_file("prompts.jsonl", &lines(&prompts));
    let (json_out, html_out) = (
        dir.path().join("report.json"),
        dir.path().join("report.html"),
    );
    let model = model();
    run(
        &bin,
        "refract-gemma-mlx",
        &[
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
            &prompts_file.display().to_string(),
            "--n-predict",
            "32",
            "--json-out",
            &json_out.display().to_string(),
            "--html-out",
            &html_out.display().to_string(),
            "--no-progress",
        ],
    );
    let refract: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_out).expect("the JSON report"))
            .expect("JSON");
    let html = std::fs::read_to_string(&html_out).expect("the HTML report");
    assert!(html.contains("REFRACT") && html.len() > 10_000);
    assert_eq!(refract["environment"]["backend"], "gemma-mlx");
    let composite = num(&refract, "composite");
    println!(
        "REFRACT {CANDIDATE}: composite {composite:.2}, band {}, axes {}",
        refract["band"], refract["composite_detail"]
    );
    assert!((0.0..=100.0).contains(&composite));

    // KLD: REFRACT's axis against our command on the same 2 × 512 chunks.
    let kld = &refract["axes"]["kld"];
    let ours = report(
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
        "REFRACT's KLD {theirs_kld} against ours {our_kld}"
    );
    assert_eq!(num(kld, "same_topp_pct"), num(ours, "same_top_percent"));

    // Trajectory: REFRACT applies the chat template to each prompt.
    let chat: Vec<Value> = prompts
        .iter()
        .map(|p| serde_json::json!({"prompt": p["prompt"], "chat": true}))
        .collect();
    let (_chat_dir, chat_file) = temp_file("chat.jsonl", &lines(&chat));
    let ours = report(
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
    assert_eq!(their_prefixes, our_prefixes);
}

#[test]
fn refract_selftest_passes_with_gemma_mlx() {
    let Some(bin) = venv_bin() else { return };
    let out = run(
        &bin,
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
