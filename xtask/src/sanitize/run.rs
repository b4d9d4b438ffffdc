//! One instrumented program run: its environment (AddressSanitizer's and
//! LeakSanitizer's options), its output in a log, its reports parsed, and a
//! verdict.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};

use super::report::{self, Finding, Report};
use crate::command;

/// AddressSanitizer's options for every run (docs/fuzzing.md, "Sanitizers"):
/// leaks checked at exit; stack use after return and initialization order
/// checked too (no measurable cost here); `addr2line` allowed as the
/// symbolizer where `llvm-symbolizer` is not on `PATH` (without one, leak
/// stacks have no function names and the suppressions match nothing). The
/// one-definition check that `cargo xtask fuzz` turns off as a precaution
/// stays on: it reports nothing here. Allocation stacks come from the fast
/// frame-pointer unwinder: a frame just above an uninstrumented allocator
/// (libstdc++'s `operator new`, MLX's) may be missing;
/// `ASAN_OPTIONS=fast_unwind_on_malloc=0` gives whole stacks at 8 times the
/// run time.
const ASAN_OPTIONS: &str =
    "detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:allow_addr2line=1";

/// What a run should end with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Exit 0 with no report.
    Clean,
    /// A report of this kind, at a frame in our code: a canary's planted error.
    Finding(&'static str),
}

/// A program to run under the sanitizer.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The name of the run in the table, the log and the report files.
    pub label: String,
    /// The instrumented executable.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// What it should end with.
    pub expect: Expect,
}

/// Where a run's output and reports go.
pub struct Paths {
    /// `target/sanitize/logs/`: one `<label>.log` of stdout and stderr per run.
    pub logs: PathBuf,
    /// `target/sanitize/reports/`: `<label>.<pid>`, written by the sanitizer.
    pub reports: PathBuf,
    /// The LeakSanitizer suppressions file.
    pub suppressions: PathBuf,
    /// Path prefixes of our code, to name the frame a finding is in.
    pub ours: Vec<String>,
}

/// What became of one run.
#[derive(Debug)]
pub struct Outcome {
    /// The plan's label.
    pub label: String,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// The exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Every report file's contents, together.
    pub report: Report,
    /// The log of its output.
    pub log: PathBuf,
    /// Why it failed, if it did.
    pub failure: Option<String>,
}

/// Runs `plan` with the sanitizer's options and judges it.
pub fn run(plan: &Plan, paths: &Paths) -> Result<Outcome> {
    for folder in [&paths.logs, &paths.reports] {
        fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
    }
    remove_reports(&paths.reports, &plan.label)?;
    let log = paths.logs.join(format!("{}.log", plan.label));
    let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let err = out
        .try_clone()
        .with_context(|| format!("opening {}", log.display()))?;
    let mut program = Command::new(&plan.program);
    program
        .args(&plan.args)
        .env("ASAN_OPTIONS", asan_options(paths, &plan.label))
        .env("LSAN_OPTIONS", lsan_options(&paths.suppressions))
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    println!(
        "\n==> {}\n$ {} > {}",
        plan.label,
        command::describe(&program),
        log.display()
    );
    let start = Instant::now();
    let status = program
        .status()
        .with_context(|| format!("could not start `{}`", command::describe(&program)))?;
    let seconds = start.elapsed().as_secs_f64();
    let report = read_reports(&paths.reports, &plan.label)?;
    let ours: Vec<&str> = paths.ours.iter().map(String::as_str).collect();
    let failure = verdict(plan.expect, status.code(), &report, &ours);
    Ok(Outcome {
        label: plan.label.clone(),
        seconds,
        code: status.code(),
        report,
        log,
        failure,
    })
}

/// ASan's options: ours, then the caller's `ASAN_OPTIONS` (later ones win),
/// then the report files' path, which the task needs.
fn asan_options(paths: &Paths, label: &str) -> String {
    let mut options = ASAN_OPTIONS.to_string();
    if let Ok(extra) = std::env::var("ASAN_OPTIONS") {
        if !extra.is_empty() {
            options.push(':');
            options.push_str(&extra);
        }
    }
    options.push_str(&format!(
        ":log_path={}",
        paths.reports.join(label).display()
    ));
    options
}

/// LeakSanitizer's options: the suppressions file, and the table of what it
/// suppressed printed into the report.
fn lsan_options(suppressions: &Path) -> String {
    format!(
        "suppressions={}:print_suppressions=1",
        suppressions.display()
    )
}

/// Why a run ended badly, or `None` if it ended as expected (the caller
/// names the log).
fn verdict(expect: Expect, code: Option<i32>, report: &Report, ours: &[&str]) -> Option<String> {
    let exit = code.map_or("a signal".to_string(), |c| format!("exit {c}"));
    match expect {
        Expect::Clean if report.findings.is_empty() && code == Some(0) => None,
        Expect::Clean if report.findings.is_empty() => {
            Some(format!("{exit} with no sanitizer report"))
        }
        Expect::Clean => Some(
            report
                .findings
                .iter()
                .map(|f| describe(f, ours))
                .collect::<Vec<_>>()
                .join("; "),
        ),
        Expect::Finding(kind) => {
            let caught = report
                .findings
                .iter()
                .any(|f| f.kind == kind && ours.iter().any(|o| f.where_in(ours).contains(o)));
            if caught && code != Some(0) {
                None
            } else {
                Some(format!(
                    "the planted {kind} was not reported in our code ({exit}, {} finding(s))",
                    report.findings.len()
                ))
            }
        }
    }
}

/// `heap-use-after-free (READ of size 8) at f file:line`.
pub fn describe(finding: &Finding, ours: &[&str]) -> String {
    let detail = if finding.detail.is_empty() {
        String::new()
    } else {
        format!(" ({})", finding.detail)
    };
    format!("{}{detail} at {}", finding.kind, finding.where_in(ours))
}

/// The report files `label` left (`<label>.<pid>`), parsed into one report.
fn read_reports(folder: &Path, label: &str) -> Result<Report> {
    let mut all = Report::default();
    for path in report_files(folder, label)? {
        let text = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let report = report::parse(&String::from_utf8_lossy(&text));
        all.findings.extend(report.findings);
        all.suppressed.extend(report.suppressed);
    }
    Ok(all)
}

/// Removes the report files an earlier run of `label` left.
fn remove_reports(folder: &Path, label: &str) -> Result<()> {
    for path in report_files(folder, label)? {
        fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}

/// The files `<label>.<pid>` in `folder`, sorted.
fn report_files(folder: &Path, label: &str) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    if !folder.is_dir() {
        return Ok(files);
    }
    for entry in fs::read_dir(folder).with_context(|| format!("listing {}", folder.display()))? {
        let path = entry
            .with_context(|| format!("listing {}", folder.display()))?
            .path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| is_report_of(&n, label)) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Whether `name` is `<label>.<pid>` (digits after the last dot).
fn is_report_of(name: &str, label: &str) -> bool {
    name.strip_prefix(label)
        .and_then(|rest| rest.strip_prefix('.'))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(kind: &str, frame: &str) -> Finding {
        Finding {
            kind: kind.into(),
            detail: String::new(),
            frames: vec![frame.into()],
        }
    }

    const OURS: &[&str] = &["/w/mlx-c/", "/w/crates/"];

    #[test]
    fn report_files_are_the_label_then_a_pid() {
        assert!(is_report_of("mlx-core-array.1234", "mlx-core-array"));
        assert!(!is_report_of("mlx-core-array-2.1234", "mlx-core-array"));
        assert!(!is_report_of("mlx-core-array.", "mlx-core-array"));
        assert!(!is_report_of("mlx-core-array.log", "mlx-core-array"));
    }

    #[test]
    fn a_clean_run_exits_0_without_findings() {
        let none = Report::default();
        assert_eq!(verdict(Expect::Clean, Some(0), &none, OURS), None);
        let failed = verdict(Expect::Clean, Some(101), &none, OURS).unwrap();
        assert!(
            failed.starts_with("exit 101 with no sanitizer report"),
            "{failed}"
        );
        let leak = Report {
            findings: vec![finding("direct leak", "f /w/crates/a.rs:1")],
            suppressed: Vec::new(),
        };
        let failed = verdict(Expect::Clean, Some(0), &leak, OURS).unwrap();
        assert_eq!(failed, "direct leak at f /w/crates/a.rs:1");
    }

    #[test]
    fn a_canary_must_be_caught_in_our_code() {
        let caught = Report {
            findings: vec![finding("heap-use-after-free", "g /w/mlx-c/src/core.cpp:9")],
            suppressed: Vec::new(),
        };
        let expect = Expect::Finding("heap-use-after-free");
        assert_eq!(verdict(expect, Some(1), &caught, OURS), None);
        // Exiting 0 means the sanitizer did not stop it.
        assert!(verdict(expect, Some(0), &caught, OURS).is_some());
        // Found only outside our code: the C++ was not instrumented.
        let elsewhere = Report {
            findings: vec![finding("heap-use-after-free", "(/lib/libmlx.so+0x1)")],
            suppressed: Vec::new(),
        };
        assert!(verdict(expect, Some(1), &elsewhere, OURS).is_some());
        assert!(verdict(expect, Some(1), &Report::default(), OURS).is_some());
    }
}
