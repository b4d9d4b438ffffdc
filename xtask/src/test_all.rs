//! `cargo xtask test`: set up, then every check and test the project has.

use std::process::Command;

use anyhow::{Context, Result};

use crate::bindings;
use crate::command;
use crate::examples;
use crate::mlx_build::Backend;
use crate::setup::{self, SetupOptions};
use crate::workspace::Workspace;

/// Sets up (with the model and the mlx-lm reference environment: the tests
/// need them), then checks the bindings, formatting, lints (the fuzz
/// targets' too) and the API documentation (warnings are errors), then runs `cargo test` with `cargo_test_args`
/// appended, then every example of the engine. Stops at the first failing
/// step and names it.
pub fn run(workspace: &Workspace, backend: Backend, cargo_test_args: &[String]) -> Result<()> {
    let options = SetupOptions {
        backend,
        force: false,
        model: true,
        reference: true,
        provision: true,
    };
    step("cargo xtask setup", || setup::run(workspace, &options))?;
    step("cargo xtask bindgen --check", || {
        bindings::run(workspace, true)
    })?;
    let cargo = |args: &[&str]| {
        let mut cargo = cargo(workspace);
        cargo.args(args);
        cargo
    };
    step("cargo fmt", || {
        command::run(&mut cargo(&["fmt", "--all", "--", "--check"]))
    })?;
    step("cargo clippy", || {
        command::run(&mut cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--release",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    // The fuzz targets are a workspace of their own (built with nightly by
    // `cargo xtask fuzz`); checking them here, on stable, keeps an API
    // change in the crates from breaking them unseen.
    step("cargo fmt and clippy (fuzz targets)", || {
        let manifest = workspace.root().join("fuzz").join("Cargo.toml");
        let manifest = manifest
            .to_str()
            .context("the fuzz manifest's path is not UTF-8")?;
        command::run(&mut cargo(&[
            "fmt",
            "--manifest-path",
            manifest,
            "--",
            "--check",
        ]))?;
        let target = workspace.root().join("target").join("fuzz-check");
        let target = target
            .to_str()
            .context("the target folder's path is not UTF-8")?;
        command::run(&mut cargo(&[
            "clippy",
            "--manifest-path",
            manifest,
            "--bins",
            "--target-dir",
            target,
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    step("cargo doc", || {
        command::run(
            cargo(&["doc", "--workspace", "--no-deps", "--release"])
                .env("RUSTDOCFLAGS", "-D warnings"),
        )
    })?;
    step("cargo test", || {
        command::run(cargo(&["test", "--workspace", "--release"]).args(cargo_test_args))
    })?;
    for name in examples::names(&workspace.engine_examples())? {
        step(&format!("example {name}"), || {
            command::run(&mut cargo(&[
                "run",
                "--release",
                "-p",
                "engine",
                "--example",
                &name,
            ]))
        })?;
    }
    println!("\nall steps passed");
    Ok(())
}

/// Runs one step, announcing it, and names it if it fails.
fn step(name: &str, body: impl FnOnce() -> Result<()>) -> Result<()> {
    println!("\n==> {name}");
    body().with_context(|| format!("step `{name}` failed"))
}

/// A `cargo` command (the one running this task) in the workspace root.
pub fn cargo(workspace: &Workspace) -> Command {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cargo = Command::new(program);
    cargo.current_dir(workspace.root());
    cargo
}
