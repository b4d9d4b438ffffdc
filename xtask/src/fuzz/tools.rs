//! The tools fuzzing needs beyond the stable toolchain: the nightly
//! toolchain (for `-Zsanitizer` and SanitizerCoverage) and `cargo-fuzz`.
//! `.ci/run` installs both on a fresh machine; here they are only checked.

use std::process::Command;

use anyhow::{bail, Result};

use crate::command;

/// The toolchain the fuzz targets are built with.
pub const TOOLCHAIN: &str = "nightly";

/// A command run under the nightly toolchain (`rustup run nightly ...`),
/// with the variables the stable `cargo xtask` runs under removed, so that
/// nothing points the nested cargo back at the stable toolchain.
pub fn nightly(program: &str) -> Command {
    let mut command = Command::new("rustup");
    command.args(["run", TOOLCHAIN, program]);
    for variable in [
        "RUSTUP_TOOLCHAIN",
        "CARGO",
        "RUSTC",
        "RUSTDOC",
        "CARGO_TARGET_DIR",
    ] {
        command.env_remove(variable);
    }
    command
}

/// Whether `command` starts and exits 0.
fn works(mut command: Command) -> bool {
    command::capture(&mut command).is_ok_and(|output| output.status.success())
}

/// Fails, saying how to install it, unless the nightly toolchain is present.
pub fn check_nightly() -> Result<()> {
    let mut rustc = nightly("rustc");
    rustc.arg("--version");
    if !works(rustc) {
        bail!(
            "the {TOOLCHAIN} toolchain is missing; install it with \
             `rustup toolchain install {TOOLCHAIN} --profile minimal` (.ci/run does)"
        );
    }
    Ok(())
}

/// Fails, saying how to install them, unless the nightly toolchain and
/// `cargo-fuzz` are present.
pub fn check() -> Result<()> {
    check_nightly()?;
    let mut fuzz = nightly("cargo");
    fuzz.args(["fuzz", "--version"]);
    if !works(fuzz) {
        bail!("cargo-fuzz is missing; install it with `cargo install cargo-fuzz --locked` (.ci/run does)");
    }
    Ok(())
}
