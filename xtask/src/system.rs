//! The host: platform checks, root, and Debian packages.

use std::process::Command;

use anyhow::{bail, Result};

use crate::command;

/// Fails unless this is x86_64 or aarch64 Linux, the platforms MLX wheels exist for.
pub fn check_platform() -> Result<()> {
    let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
    if os != "linux" || !matches!(arch, "x86_64" | "aarch64") {
        bail!(
            "MLX 0.32.4 wheels exist for x86_64 and aarch64 Linux only; this is {arch} {os}. \
             Build MLX 0.32.4 yourself and set MLX_DIR to its install folder \
             (the one with include/mlx/mlx.h and lib/libmlx.so)"
        );
    }
    Ok(())
}

/// The Debian multiarch triple of this machine, e.g. `x86_64-linux-gnu`.
pub fn multiarch() -> String {
    format!("{}-linux-gnu", std::env::consts::ARCH)
}

/// Whether this process runs as root.
fn is_root() -> Result<bool> {
    let uid = command::stdout_of(Command::new("id").arg("-u"))?;
    Ok(uid.trim() == "0")
}

/// Makes sure what the Debian package `package` provides is present, as told
/// by `present`. As root it installs the package with apt-get; otherwise it
/// fails with the command to run. `purpose` says what needs the package.
pub fn ensure_debian_package(
    package: &str,
    purpose: &str,
    present: &dyn Fn() -> bool,
) -> Result<()> {
    if present() {
        return Ok(());
    }
    let install = format!("apt-get update && apt-get install -y {package}");
    if Command::new("apt-get").arg("--version").output().is_err() {
        bail!(
            "{purpose} needs what the Debian package {package} provides, and this system has \
             no apt-get; install the equivalent package with your package manager"
        );
    }
    if !is_root()? {
        bail!(
            "{purpose} needs the Debian package {package}. Install it, then run this again:\n  \
             sudo sh -c '{install}'"
        );
    }
    println!("{purpose} needs the Debian package {package}; installing it");
    command::run(
        Command::new("apt-get")
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    command::run(
        Command::new("apt-get")
            .args(["install", "-y", package])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    if !present() {
        bail!("installed {package}, but {purpose} still cannot find what it needs from it");
    }
    Ok(())
}
