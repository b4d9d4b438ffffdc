//! `cargo xtask fuzz [TARGET] [--seconds N] [--jobs J]`: builds the
//! cargo-fuzz targets of `fuzz/` (nightly, AddressSanitizer by default) and
//! runs one or all of them, J at a time, for N seconds each on a scratch
//! copy of their committed corpus,
//! replaying `fuzz/regressions/<target>/` first. Prints, per target, the
//! executions, libFuzzer's coverage (`cov`, `ft`) and whether it crashed; a
//! crashing input is copied into `fuzz/regressions/<target>/` and the task
//! fails. See docs/fuzzing.md.

mod stats;
mod target;
pub mod tools;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use anyhow::{anyhow, bail, Result};
use clap::ValueEnum;

use crate::command;
use crate::mlx_build::Backend;
use crate::setup::{self, SetupOptions};
use crate::workspace::Workspace;

use target::Outcome;

/// The fuzz targets, in the order they run.
pub const TARGETS: &[&str] = &[
    "gguf",
    "safetensors",
    "config_json",
    "tokenizer",
    "chat_template",
    "kv_spec",
    "prompts_jsonl",
    "corpus",
];

/// The sanitizer the targets are built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Sanitizer {
    /// AddressSanitizer (cargo-fuzz's default).
    Address,
    /// None: faster builds and runs, memory errors in unsafe code go unseen.
    None,
}

impl Sanitizer {
    fn name(self) -> &'static str {
        match self {
            Sanitizer::Address => "address",
            Sanitizer::None => "none",
        }
    }
}

/// What `cargo xtask fuzz` should do.
pub struct FuzzOptions {
    /// One target, or all of them.
    pub target: Option<String>,
    /// Seconds of fuzzing per target.
    pub seconds: u64,
    /// The sanitizer to build with.
    pub sanitizer: Sanitizer,
    /// Start from the committed seeds alone, forgetting what earlier runs found.
    pub fresh: bool,
    /// The MLX build the targets link.
    pub backend: Backend,
    /// Targets fuzzed at once (libFuzzer uses one core per target).
    pub jobs: usize,
}

/// Where fuzzing reads and writes, relative to the workspace root.
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// The layout of the workspace at `root`.
    pub fn new(root: &Path) -> Layout {
        Layout {
            root: root.to_path_buf(),
        }
    }

    /// `fuzz/`: the cargo-fuzz crate.
    fn fuzz_dir(&self) -> PathBuf {
        self.root.join("fuzz")
    }

    /// `target/fuzz/`: builds, scratch corpora, artifacts and logs.
    fn work_dir(&self) -> PathBuf {
        self.root.join("target/fuzz")
    }

    /// The built binary of `target`.
    pub fn binary(&self, target: &str) -> PathBuf {
        self.work_dir()
            .join(format!(
                "{}-unknown-linux-gnu/release",
                std::env::consts::ARCH
            ))
            .join(target)
    }

    /// `fuzz/corpus/<target>`: the committed seeds.
    pub fn seeds(&self, target: &str) -> PathBuf {
        self.fuzz_dir().join("corpus").join(target)
    }

    /// `fuzz/regressions/<target>`: inputs that once failed, replayed first.
    pub fn regressions(&self, target: &str) -> PathBuf {
        self.fuzz_dir().join("regressions").join(target)
    }

    /// `fuzz/dicts/<target>.dict`: the libFuzzer dictionary, if any.
    pub fn dict(&self, target: &str) -> PathBuf {
        self.fuzz_dir().join("dicts").join(format!("{target}.dict"))
    }

    /// `target/fuzz/corpus/<target>`: the corpus a run grows.
    pub fn work_corpus(&self, target: &str) -> PathBuf {
        self.work_dir().join("corpus").join(target)
    }

    /// `target/fuzz/artifacts/<target>`: where libFuzzer writes failing inputs.
    pub fn artifacts(&self, target: &str) -> PathBuf {
        self.work_dir().join("artifacts").join(target)
    }

    /// `target/fuzz/logs/<target>.<what>.log`: a run's output.
    pub fn log(&self, target: &str, what: &str) -> PathBuf {
        self.work_dir()
            .join("logs")
            .join(format!("{target}.{what}.log"))
    }

    /// The folder the targets write the files they read into: memory
    /// (`/dev/shm`) where there is some, else `target/fuzz/scratch`.
    pub fn scratch(&self, target: &str) -> PathBuf {
        let shm = Path::new("/dev/shm");
        let name = format!("gemma-fuzz-{target}-{}", std::process::id());
        if shm.is_dir() {
            shm.join(name)
        } else {
            self.work_dir().join("scratch").join(name)
        }
    }
}

/// Checks the tools, sets up MLX and the default model (the tokenizer
/// targets encode with its vocabulary), builds the targets, runs them and
/// prints a summary; fails if any target failed.
pub fn run(workspace: &Workspace, options: &FuzzOptions) -> Result<()> {
    let targets = selected(options.target.as_deref())?;
    tools::check()?;
    let setup_options = SetupOptions {
        backend: options.backend,
        force: false,
        model: true,
        reference: false,
        provision: true,
    };
    setup::run(workspace, &setup_options)?;
    let layout = Layout::new(workspace.root());
    build(&layout, options)?;
    let outcomes = run_all(&layout, &targets, options)?;
    println!("\n{}", summary(&outcomes));
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.failure.is_some()).collect();
    if !failed.is_empty() {
        for outcome in &failed {
            eprintln!(
                "{}: {}",
                outcome.target,
                outcome.failure.as_deref().unwrap_or_default()
            );
        }
        bail!("{} of {} fuzz targets failed", failed.len(), outcomes.len());
    }
    Ok(())
}

/// Runs `targets`, `options.jobs` at a time, and returns their outcomes in order.
fn run_all(layout: &Layout, targets: &[&str], options: &FuzzOptions) -> Result<Vec<Outcome>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Outcome>>>> =
        Mutex::new(targets.iter().map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..options.jobs.clamp(1, targets.len().max(1)) {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(target) = targets.get(index) else {
                    break;
                };
                println!("\n==> fuzz {target} ({} s)", options.seconds);
                let outcome = target::run(layout, target, options.seconds, options.fresh);
                if let Some(slot) = lock(&results).get_mut(index) {
                    *slot = Some(outcome);
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(PoisonError::into_inner);
    results
        .into_iter()
        .zip(targets)
        .map(|(result, target)| {
            result.unwrap_or_else(|| Err(anyhow!("fuzz target {target} did not run")))
        })
        .collect()
}

/// The guarded value, even if a thread panicked holding the lock.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The targets to run: `target` alone (which must exist) or all of them.
fn selected(target: Option<&str>) -> Result<Vec<&'static str>> {
    match target {
        None => Ok(TARGETS.to_vec()),
        Some(name) => match TARGETS.iter().find(|t| **t == name) {
            Some(t) => Ok(vec![*t]),
            None => bail!(
                "no fuzz target '{name}'; the targets are {}",
                TARGETS.join(", ")
            ),
        },
    }
}

/// `cargo fuzz build` of the selected targets: release, debug assertions
/// and overflow checks on, into `target/fuzz`.
fn build(layout: &Layout, options: &FuzzOptions) -> Result<()> {
    let mut cargo = tools::nightly("cargo");
    cargo
        .current_dir(&layout.root)
        .args(["fuzz", "build", "--release", "--debug-assertions"])
        .arg("--fuzz-dir")
        .arg(layout.fuzz_dir())
        .arg("--target-dir")
        .arg(layout.work_dir())
        .args(["--sanitizer", options.sanitizer.name()]);
    if let Some(target) = &options.target {
        cargo.arg(target);
    }
    command::run(&mut cargo)
}

/// The per-target table: executions, coverage, corpus, peak memory, result.
fn summary(outcomes: &[Outcome]) -> String {
    let mut table = format!(
        "{:<14} {:>7} {:>11} {:>7} {:>7} {:>7} {:>8} {:>11}  result\n",
        "target", "seconds", "executions", "cov", "ft", "corpus", "rss MB", "regressions"
    );
    for o in outcomes {
        let s = &o.stats;
        let result = if o.failure.is_some() { "FAILED" } else { "ok" };
        table.push_str(&format!(
            "{:<14} {:>7} {:>11} {:>7} {:>7} {:>7} {:>8} {:>11}  {result}\n",
            o.target, o.seconds, s.executions, s.cov, s.ft, s.corpus, s.peak_rss_mb, o.replayed
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_target_or_all_of_them() {
        assert_eq!(selected(None).unwrap(), TARGETS);
        assert_eq!(selected(Some("kv_spec")).unwrap(), ["kv_spec"]);
        let error = selected(Some("nope")).unwrap_err().to_string();
        assert!(
            error.starts_with("no fuzz target 'nope'; the targets are gguf, "),
            "{error}"
        );
    }

    #[test]
    fn every_target_has_a_source_and_seeds() {
        let workspace = Workspace::locate().unwrap();
        let layout = Layout::new(workspace.root());
        for target in TARGETS {
            let source = layout.fuzz_dir().join(format!("fuzz_targets/{target}.rs"));
            assert!(source.is_file(), "{}", source.display());
            let seeds = std::fs::read_dir(layout.seeds(target)).unwrap().count();
            assert!(seeds >= 4, "{target} has {seeds} seeds");
        }
    }

    #[test]
    fn the_summary_has_a_row_per_target() {
        let outcome = |target: &str, failure: Option<&str>| Outcome {
            target: target.to_string(),
            replayed: 1,
            stats: stats::RunStats {
                executions: 1234,
                cov: 56,
                ft: 78,
                corpus: 9,
                peak_rss_mb: 100,
            },
            seconds: 30,
            failure: failure.map(str::to_string),
        };
        let table = summary(&[outcome("gguf", None), outcome("kv_spec", Some("crash"))]);
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows.len(), 3);
        assert!(
            rows[1].starts_with("gguf") && rows[1].ends_with("ok"),
            "{table}"
        );
        assert!(
            rows[2].contains("1234") && rows[2].ends_with("FAILED"),
            "{table}"
        );
    }
}
