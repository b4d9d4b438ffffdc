//! `cargo xtask run`: set up, then run the `gemma-mlx` command.

use anyhow::{bail, Context, Result};

use crate::command;
use crate::mlx_build::Backend;
use crate::setup::{self, SetupOptions};
use crate::test_all::cargo;
use crate::workspace::Workspace;

/// The engine's package and binary.
const PACKAGE: &str = "engine";
const BINARY: &str = "gemma-mlx";

/// What `gemma-mlx` runs when given no arguments: a short generation.
const DEFAULT_ARGS: &[&str] = &["generate", "The capital of France is", "--max-tokens", "64"];

/// Sets up MLX and the model (not the mlx-lm environment), then runs `gemma-mlx` with `args` (or a sample
/// generation when there are none).
pub fn run(workspace: &Workspace, backend: Backend, args: &[String]) -> Result<()> {
    let options = SetupOptions {
        backend,
        force: false,
        model: true,
        reference: false,
        provision: true,
    };
    setup::run(workspace, &options)?;
    if !engine_binary_exists(workspace)? {
        bail!(
            "setup is done, but the `{BINARY}` command (package `{PACKAGE}`) does not exist \
             yet; `cargo xtask run` will work once it lands"
        );
    }
    let mut run = cargo(workspace);
    run.args([
        "run",
        "--release",
        "--package",
        PACKAGE,
        "--bin",
        BINARY,
        "--",
    ]);
    if args.is_empty() {
        run.args(DEFAULT_ARGS);
    } else {
        run.args(args);
    }
    println!();
    command::run(&mut run)
}

/// Whether the workspace has the `gemma-mlx` binary target, per `cargo metadata`.
fn engine_binary_exists(workspace: &Workspace) -> Result<bool> {
    let metadata = command::stdout_of(cargo(workspace).args([
        "metadata",
        "--no-deps",
        "--format-version",
        "1",
    ]))?;
    let metadata: serde_json::Value =
        serde_json::from_str(&metadata).context("`cargo metadata` printed something not JSON")?;
    let packages = metadata["packages"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    Ok(packages
        .iter()
        .filter(|package| package["name"] == PACKAGE)
        .filter_map(|package| package["targets"].as_array())
        .flatten()
        .any(|target| {
            target["name"] == BINARY
                && target["kind"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|kind| kind == "bin"))
        }))
}
