//! One fuzz target's run: replay its regression inputs, then fuzz its
//! corpus for a while, keeping any crashing input as a new regression case.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};

use super::stats::{self, RunStats};
use super::Layout;
use crate::command;

/// libFuzzer's limits for every target: seconds one input may take, and
/// megabytes the process, and any single allocation, may reach. A 4 KB input
/// that asks for more than `MALLOC_LIMIT_MB` at once is a finding.
const TIMEOUT_S: u64 = 10;
const RSS_LIMIT_MB: u64 = 2048;
const MALLOC_LIMIT_MB: u64 = 512;

/// What became of one target.
#[derive(Debug)]
pub struct Outcome {
    /// The target's name.
    pub target: String,
    /// Regression inputs replayed before fuzzing.
    pub replayed: usize,
    /// The fuzzing run's figures.
    pub stats: RunStats,
    /// Seconds asked for.
    pub seconds: u64,
    /// Why the target failed, if it did: the crashing inputs and where they went.
    pub failure: Option<String>,
}

/// Replays `target`'s regression inputs and, if they pass, fuzzes it for
/// `seconds` on a scratch copy of its committed corpus.
pub fn run(layout: &Layout, target: &str, seconds: u64, fresh: bool) -> Result<Outcome> {
    let binary = layout.binary(target);
    let regressions = files_in(&layout.regressions(target))?;
    let mut outcome = Outcome {
        target: target.to_string(),
        replayed: regressions.len(),
        stats: RunStats::default(),
        seconds,
        failure: None,
    };
    let scratch = layout.scratch(target);
    fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    if !regressions.is_empty() {
        let mut replay = libfuzzer(&binary, &scratch);
        replay.args(&regressions);
        let log = layout.log(target, "replay");
        if !run_logged(&mut replay, &log)? {
            outcome.failure = Some(format!(
                "a regression input of fuzz/regressions/{target}/ fails again (log: {})",
                log.display()
            ));
            return Ok(outcome);
        }
    }
    let corpus = prepare_corpus(layout, target, fresh)?;
    let artifacts = layout.artifacts(target);
    if artifacts.exists() {
        fs::remove_dir_all(&artifacts)
            .with_context(|| format!("clearing {}", artifacts.display()))?;
    }
    fs::create_dir_all(&artifacts).with_context(|| format!("creating {}", artifacts.display()))?;
    let mut fuzz = libfuzzer(&binary, &scratch);
    fuzz.arg(format!("-max_total_time={seconds}"))
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()));
    let dict = layout.dict(target);
    if dict.is_file() {
        fuzz.arg(format!("-dict={}", dict.display()));
    }
    fuzz.arg(&corpus);
    let log = layout.log(target, "fuzz");
    let passed = run_logged(&mut fuzz, &log)?;
    outcome.stats = stats::parse(&fs::read_to_string(&log).unwrap_or_default());
    let found = files_in(&artifacts)?;
    if !passed || !found.is_empty() {
        let kept = keep_regressions(layout, target, &found)?;
        outcome.failure = Some(format!(
            "libFuzzer found a failing input (log: {}); kept as {}",
            log.display(),
            if kept.is_empty() {
                "nothing (no artifact written)".to_string()
            } else {
                kept.join(", ")
            }
        ));
    }
    // The scratch files of the readers are of no use after the run.
    let _ = fs::remove_dir_all(&scratch);
    Ok(outcome)
}

/// The target's binary with the limits every run uses, writing its scratch
/// files under `scratch`.
fn libfuzzer(binary: &Path, scratch: &Path) -> Command {
    let mut command = Command::new(binary);
    command
        .arg(format!("-timeout={TIMEOUT_S}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-malloc_limit_mb={MALLOC_LIMIT_MB}"))
        .env("GEMMA_FUZZ_SCRATCH", scratch);
    if std::env::var_os("ASAN_OPTIONS").is_none() {
        // MLX is not built with ASan; its globals trip the ODR check.
        command.env("ASAN_OPTIONS", "detect_odr_violation=0");
    }
    command
}

/// Runs `command` with its output going to `log`; whether it exited 0.
fn run_logged(command: &mut Command, log: &Path) -> Result<bool> {
    if let Some(folder) = log.parent() {
        fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
    }
    let out = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out
        .try_clone()
        .with_context(|| format!("opening {}", log.display()))?;
    println!("$ {} > {}", command::describe(command), log.display());
    let status = command
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .status()
        .with_context(|| format!("could not start `{}`", command::describe(command)))?;
    Ok(status.success())
}

/// The scratch corpus under `target/fuzz/corpus/<target>`: what earlier runs
/// found (unless `fresh`), plus the committed seeds copied in, so fuzzing
/// never writes into the repository.
fn prepare_corpus(layout: &Layout, target: &str, fresh: bool) -> Result<PathBuf> {
    let corpus = layout.work_corpus(target);
    if fresh && corpus.exists() {
        fs::remove_dir_all(&corpus).with_context(|| format!("clearing {}", corpus.display()))?;
    }
    fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    for seed in files_in(&layout.seeds(target))? {
        if let Some(name) = seed.file_name() {
            fs::copy(&seed, corpus.join(name))
                .with_context(|| format!("copying {}", seed.display()))?;
        }
    }
    Ok(corpus)
}

/// Copies the failing inputs libFuzzer wrote into `fuzz/regressions/<target>/`,
/// where every later run replays them first; their new paths, relative to the root.
fn keep_regressions(layout: &Layout, target: &str, found: &[PathBuf]) -> Result<Vec<String>> {
    let folder = layout.regressions(target);
    fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    let mut kept = Vec::new();
    for input in found {
        let Some(name) = input.file_name() else {
            continue;
        };
        let to = folder.join(name);
        fs::copy(input, &to).with_context(|| format!("copying {}", input.display()))?;
        kept.push(format!(
            "fuzz/regressions/{target}/{}",
            name.to_string_lossy()
        ));
    }
    Ok(kept)
}

/// The plain files in `folder`, sorted; none when it does not exist.
fn files_in(folder: &Path) -> Result<Vec<PathBuf>> {
    if !folder.is_dir() {
        return Ok(Vec::new());
    }
    let mut files = Vec::new();
    for entry in fs::read_dir(folder).with_context(|| format!("listing {}", folder.display()))? {
        let path = entry
            .with_context(|| format!("listing {}", folder.display()))?
            .path();
        let hidden = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if path.is_file() && !hidden {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_in_lists_plain_files_sorted_without_hidden_ones() {
        let dir = std::env::temp_dir().join(format!("xtask-fuzz-files-{}", std::process::id()));
        fs::create_dir_all(dir.join("sub")).unwrap();
        for name in ["b", "a", ".gitkeep"] {
            fs::write(dir.join(name), name).unwrap();
        }
        let names: Vec<String> = files_in(&dir)
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn a_missing_folder_has_no_files() {
        assert!(files_in(Path::new("/no/such/folder")).unwrap().is_empty());
    }
}
