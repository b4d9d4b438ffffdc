//! `cargo xtask sanitize [--quick]`: builds `mlx-core`'s tests and the
//! `gemma-mlx` command with AddressSanitizer (Rust and our `mlx-c` C++; see
//! [`instrumented`]), proves on two planted errors (the canaries of
//! `crates/mlx-core/tests/sanitizer_canary.rs`) that a use after free in
//! `mlx-c` and a leaked array are reported, then runs every `mlx-core` test
//! binary, a short generation and a two-chunk KLD run, each under
//! AddressSanitizer and LeakSanitizer with the suppressions of
//! `xtask/sanitize/lsan.supp`. Prints a table of the runs and fails on any
//! invalid read or write, any leak not suppressed, or a canary not caught.
//! See docs/fuzzing.md, "Sanitizers".

mod instrumented;
mod report;
mod run;

use std::path::Path;

use anyhow::{bail, Result};

use crate::fuzz::tools;
use crate::mlx_build::Backend;
use crate::model::MODEL_FILE;
use crate::setup::{self, SetupOptions};
use crate::workspace::Workspace;

use instrumented::Executable;
use run::{Expect, Outcome, Plan};

/// What `cargo xtask sanitize` should do.
pub struct SanitizeOptions {
    /// The CI subset: the canaries, the `mlx-core` tests, one generation and
    /// the KLD run.
    pub quick: bool,
    /// The MLX build to link.
    pub backend: Backend,
}

/// The canaries: the test's name and the report it must produce.
const CANARIES: &[(&str, &str)] = &[
    ("canary_handle_used_after_free", "heap-use-after-free"),
    ("canary_leaked_array", "direct leak"),
];

/// The test binary holding the canaries (run only for them).
const CANARY_BINARY: &str = "sanitizer_canary";

/// The prompt of the short generations.
const PROMPT: &str = "The capital of France is";

/// Sets up MLX and the default model, builds with the instrumentation, runs
/// the plan and prints its table; fails on any finding.
pub fn run(workspace: &Workspace, options: &SanitizeOptions) -> Result<()> {
    tools::check_nightly()?;
    setup::run(
        workspace,
        &SetupOptions {
            backend: options.backend,
            force: false,
            model: true,
            reference: false,
            provision: true,
        },
    )?;
    let root = workspace.root();
    let target_dir = root.join("target/sanitize");
    let tests = instrumented::build(root, &target_dir, &["test", "-p", "mlx-core", "--no-run"])?;
    let engine = instrumented::build(
        root,
        &target_dir,
        &["build", "-p", "engine", "--bin", "gemma-mlx"],
    )?;
    let Some(gemma_mlx) = engine.iter().find(|e| e.name == "gemma-mlx") else {
        bail!("the build made no gemma-mlx binary");
    };
    if !instrumented::on_path("llvm-symbolizer") {
        println!(
            "note: no llvm-symbolizer on PATH; reports are symbolized with addr2line (slower)"
        );
    }
    let model = workspace.model_root().join(MODEL_FILE);
    let corpus = root.join("crates/gemma/tests/fixtures/text/essays.txt");
    let plans = plans(&tests, &gemma_mlx.path, &model, &corpus, options.quick);
    let paths = run::Paths {
        logs: target_dir.join("logs"),
        reports: target_dir.join("reports"),
        suppressions: root.join("xtask/sanitize/lsan.supp"),
        ours: vec![
            format!("{}/mlx-c/", root.display()),
            format!("{}/crates/", root.display()),
        ],
    };
    let mut outcomes = Vec::new();
    for plan in &plans {
        outcomes.push(run::run(plan, &paths)?);
    }
    println!("\n{}", summary(&plans, &outcomes));
    let ours: Vec<&str> = paths.ours.iter().map(String::as_str).collect();
    conclude(&outcomes, &ours)
}

/// The runs: the canaries first (if they are not caught, nothing after
/// them means anything), then every `mlx-core` test binary, then
/// `gemma-mlx`. `quick` keeps one generation and the KLD run; the full plan
/// adds a generation through our CPU kernels (`--weights native`), MLX's
/// compiled decode step and a quantized KV cache, and a chat turn in
/// bfloat16 with TurboQuant caches.
fn plans(
    tests: &[Executable],
    gemma_mlx: &Path,
    model: &Path,
    corpus: &Path,
    quick: bool,
) -> Vec<Plan> {
    let mut plans = Vec::new();
    if let Some(canary) = tests.iter().find(|t| t.name == CANARY_BINARY) {
        for (test, kind) in CANARIES {
            plans.push(Plan {
                label: format!("canary-{}", test.trim_start_matches("canary_")),
                program: canary.path.clone(),
                args: strings(&["--ignored", "--exact", test, "--test-threads=1"]),
                expect: Expect::Finding(kind),
            });
        }
    }
    let mut tests: Vec<&Executable> = tests.iter().filter(|t| t.name != CANARY_BINARY).collect();
    tests.sort_by(|a, b| a.name.cmp(&b.name));
    for test in tests {
        plans.push(Plan {
            label: format!("mlx-core-{}", test.name),
            program: test.path.clone(),
            args: Vec::new(),
            expect: Expect::Clean,
        });
    }
    let model = model.display().to_string();
    let engine = |label: &str, args: &[&str]| Plan {
        label: label.to_string(),
        program: gemma_mlx.to_path_buf(),
        args: strings(args)
            .into_iter()
            .chain(["--model".to_string(), model.clone()])
            .collect(),
        expect: Expect::Clean,
    };
    plans.push(engine(
        "generate",
        &["generate", PROMPT, "--max-tokens", "4"],
    ));
    if !quick {
        plans.push(engine(
            "generate-native-compiled",
            &[
                "generate",
                PROMPT,
                "--max-tokens",
                "4",
                "--weights",
                "native",
                "--decode",
                "compiled",
                "--kv",
                "ctk=q8_0,ctv=q4_0",
            ],
        ));
        plans.push(engine(
            "chat-bf16-turbo",
            &[
                "generate",
                PROMPT,
                "--chat",
                "--max-tokens",
                "4",
                "--dtype",
                "bfloat16",
                "--kv",
                "ctk=turbo4,ctv=turbo3",
            ],
        ));
    }
    let corpus = corpus.display().to_string();
    plans.push(engine(
        "kld",
        &[
            "kld",
            "--corpus",
            &corpus,
            "--chunks",
            "2",
            "--ctx",
            "256",
            "--cand",
            "ctk=q4_0,ctv=q4_0",
        ],
    ));
    plans
}

/// Owned copies of `args`.
fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// The table of runs: seconds, exit code, findings, suppressed leaks, result.
fn summary(plans: &[Plan], outcomes: &[Outcome]) -> String {
    let mut table = format!(
        "{:<28} {:>8} {:>5} {:>8} {:>10}  result\n",
        "run", "seconds", "exit", "findings", "suppressed"
    );
    for (plan, o) in plans.iter().zip(outcomes) {
        let result = match (plan.expect, &o.failure) {
            (_, Some(_)) => "FAILED",
            (Expect::Clean, None) => "ok",
            (Expect::Finding(_), None) => "caught (planted)",
        };
        let suppressed: u64 = o.report.suppressed.iter().map(|s| s.count).sum();
        let exit = o.code.map_or("sig".to_string(), |c| c.to_string());
        table.push_str(&format!(
            "{:<28} {:>8.1} {:>5} {:>8} {:>10}  {result}\n",
            o.label,
            o.seconds,
            exit,
            o.report.findings.len(),
            suppressed
        ));
    }
    table
}

/// Prints what failed and fails, or says what the clean runs showed.
fn conclude(outcomes: &[Outcome], ours: &[&str]) -> Result<()> {
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.failure.is_some()).collect();
    for outcome in &failed {
        eprintln!(
            "{}: {} (log: {})",
            outcome.label,
            outcome.failure.as_deref().unwrap_or_default(),
            outcome.log.display()
        );
        for finding in outcome.report.findings.iter().take(5) {
            eprintln!("  {}", run::describe(finding, ours));
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} sanitizer runs failed (reports: target/sanitize/reports/)",
            failed.len(),
            outcomes.len()
        );
    }
    let suppressed: Vec<String> = suppressed_patterns(outcomes);
    println!(
        "no invalid reads or writes, no leaks of ours in {} runs; the canaries were caught",
        outcomes.len()
    );
    if !suppressed.is_empty() {
        println!(
            "suppressed (xtask/sanitize/lsan.supp): {}",
            suppressed.join(", ")
        );
    }
    Ok(())
}

/// Each suppression pattern used, with its allocations over all runs.
fn suppressed_patterns(outcomes: &[Outcome]) -> Vec<String> {
    let mut totals: Vec<(String, u64, u64)> = Vec::new();
    for s in outcomes.iter().flat_map(|o| &o.report.suppressed) {
        match totals.iter_mut().find(|(p, _, _)| *p == s.pattern) {
            Some(total) => {
                total.1 += s.count;
                total.2 += s.bytes;
            }
            None => totals.push((s.pattern.clone(), s.count, s.bytes)),
        }
    }
    totals
        .into_iter()
        .map(|(p, count, bytes)| format!("{p} ({count} allocations, {bytes} bytes)"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn executable(name: &str) -> Executable {
        Executable {
            name: name.into(),
            path: PathBuf::from(format!("/t/{name}")),
        }
    }

    #[test]
    fn the_canaries_run_first_and_the_quick_plan_is_a_subset() {
        let tests = [
            executable("memory"),
            executable(CANARY_BINARY),
            executable("array"),
        ];
        let full = plans(
            &tests,
            Path::new("/g"),
            Path::new("/m"),
            Path::new("/c"),
            false,
        );
        let quick = plans(
            &tests,
            Path::new("/g"),
            Path::new("/m"),
            Path::new("/c"),
            true,
        );
        let labels = |plans: &[Plan]| plans.iter().map(|p| p.label.clone()).collect::<Vec<_>>();
        assert_eq!(
            labels(&full),
            [
                "canary-handle_used_after_free",
                "canary-leaked_array",
                "mlx-core-array",
                "mlx-core-memory",
                "generate",
                "generate-native-compiled",
                "chat-bf16-turbo",
                "kld",
            ]
        );
        assert!(labels(&quick).iter().all(|l| labels(&full).contains(l)));
        assert!(quick.len() < full.len());
        let canary = &full[0];
        assert_eq!(canary.expect, Expect::Finding("heap-use-after-free"));
        assert!(canary
            .args
            .contains(&"canary_handle_used_after_free".to_string()));
        let generate = &full[4];
        assert!(generate
            .args
            .ends_with(&["--model".to_string(), "/m".to_string()]));
    }

    #[test]
    fn suppressions_are_totalled_by_pattern() {
        let outcome = |count| Outcome {
            label: "x".into(),
            seconds: 1.0,
            code: Some(0),
            report: report::Report {
                findings: Vec::new(),
                suppressed: vec![report::Suppressed {
                    count,
                    bytes: 10 * count,
                    pattern: "p".into(),
                }],
            },
            log: PathBuf::from("x.log"),
            failure: None,
        };
        assert_eq!(
            suppressed_patterns(&[outcome(1), outcome(2)]),
            ["p (3 allocations, 30 bytes)"]
        );
    }
}
