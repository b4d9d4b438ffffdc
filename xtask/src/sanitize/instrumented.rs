//! Building with AddressSanitizer: the nightly cargo with
//! `-Zsanitizer=address` for the Rust code and `-fsanitize=address` for the
//! C++ the `cc` crate compiles (our `mlx-c/`, through `CXXFLAGS`), into
//! `target/sanitize/`. `libmlx.so` is a prebuilt wheel and stays
//! uninstrumented: its reads and writes go unchecked, but every allocation
//! it makes goes through AddressSanitizer's `malloc`, so what we fail to
//! free of it is still seen as a leak.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::command;
use crate::fuzz::tools;

/// Rust: AddressSanitizer (LeakSanitizer comes with it on Linux) and frame
/// pointers, so that the runtime's fast unwinder sees our frames.
const RUSTFLAGS: &str = "-Zsanitizer=address -Cforce-frame-pointers=yes";

/// C++ (`mlx-c/`, and any other C++ a dependency's build script compiles):
/// the same, with debug information for file and line in reports.
const CXXFLAGS: &str = "-fsanitize=address -fno-omit-frame-pointer -g";

/// The host's target triple. The build names it explicitly so that build
/// scripts and procedural macros are built without the sanitizer.
pub fn triple() -> String {
    format!("{}-unknown-linux-gnu", std::env::consts::ARCH)
}

/// A built executable: a test binary or the `gemma-mlx` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executable {
    /// The target's name (`array`, `memory`, `mlx_core`, `gemma-mlx`).
    pub name: String,
    /// The file.
    pub path: PathBuf,
}

/// `cargo ARGS` under the nightly toolchain with the instrumentation, in
/// `root`, building into `target_dir` in the release profile with line
/// tables (for file:line in reports). Prints cargo's progress; returns the
/// executables it built, from its JSON messages.
pub fn build(root: &Path, target_dir: &Path, args: &[&str]) -> Result<Vec<Executable>> {
    let mut cargo = tools::nightly("cargo");
    cargo
        .current_dir(root)
        .args(args)
        .args(["--release", "--message-format=json-render-diagnostics"])
        .args(["--target", &triple()])
        .arg("--target-dir")
        .arg(target_dir)
        .env("RUSTFLAGS", RUSTFLAGS)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("CXXFLAGS", CXXFLAGS)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "line-tables-only")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let line = command::describe(&cargo);
    println!("$ RUSTFLAGS=\"{RUSTFLAGS}\" CXXFLAGS=\"{CXXFLAGS}\" {line}");
    let output = cargo
        .output()
        .with_context(|| format!("could not start `{line}`"))?;
    if !output.status.success() {
        bail!("`{line}` failed ({})", output.status);
    }
    let executables = executables(&String::from_utf8_lossy(&output.stdout));
    if executables.is_empty() {
        bail!("`{line}` built no executable");
    }
    Ok(executables)
}

/// The executables in cargo's JSON messages (`"reason":
/// "compiler-artifact"` with an `"executable"`), in the order built.
/// Lines that are not such messages are skipped.
pub fn executables(messages: &str) -> Vec<Executable> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter_map(|message| {
            let path = message["executable"].as_str()?;
            let name = message["target"]["name"].as_str()?;
            Some(Executable {
                name: name.to_string(),
                path: PathBuf::from(path),
            })
        })
        .collect()
}

/// Whether `program` is on `PATH` (for `llvm-symbolizer`).
pub fn on_path(program: &str) -> bool {
    let mut which = Command::new("sh");
    which.args(["-c", &format!("command -v {program}")]);
    command::capture(&mut which).is_ok_and(|output| output.status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executables_come_from_compiler_artifact_messages() {
        let messages = r#"{"reason":"compiler-artifact","target":{"name":"half","kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","target":{"name":"array","kind":["test"]},"executable":"/t/deps/array-12ab"}
{"reason":"build-script-executed","package_id":"mlx-sys"}
not json at all
{"reason":"compiler-artifact","target":{"name":"gemma-mlx","kind":["bin"]},"executable":"/t/release/gemma-mlx"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            executables(messages),
            [
                Executable {
                    name: "array".into(),
                    path: "/t/deps/array-12ab".into(),
                },
                Executable {
                    name: "gemma-mlx".into(),
                    path: "/t/release/gemma-mlx".into(),
                },
            ]
        );
    }

    #[test]
    fn the_triple_is_the_hosts_linux_gnu_one() {
        assert!(triple().ends_with("-unknown-linux-gnu"));
    }
}
