//! Finding an MLX install: `MLX_DIR`, then setup's record, then Python's `mlx`.
//!
//! `crates/mlx-sys/build.rs` looks in the same order and reads the same record.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::mlx_build::{Backend, MLX_VERSION};
use crate::python;
use crate::record::Record;
use crate::workspace::Workspace;

/// Where an MLX install was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The `MLX_DIR` environment variable.
    EnvVar,
    /// The record an earlier `cargo xtask setup` wrote.
    Record,
    /// An importable Python `mlx` package.
    Python,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::EnvVar => "MLX_DIR",
            Source::Record => "provisioned by cargo xtask setup",
            Source::Python => "the Python mlx install",
        })
    }
}

/// An MLX install: a folder with `include/mlx/mlx.h` and `lib/libmlx.so`.
#[derive(Clone, Debug)]
pub struct Found {
    /// How it was found.
    pub source: Source,
    /// The folder.
    pub dir: PathBuf,
}

impl Found {
    /// `lib/libmlx.so` in the install.
    pub fn libmlx(&self) -> PathBuf {
        libmlx(&self.dir)
    }
}

/// `lib/libmlx.so` under an MLX folder.
pub fn libmlx(mlx_dir: &Path) -> PathBuf {
    mlx_dir.join("lib/libmlx.so")
}

/// Fails, naming what is missing, unless `dir` holds MLX's header and library.
pub fn check_layout(dir: &Path) -> Result<()> {
    for needed in ["include/mlx/mlx.h", "lib/libmlx.so"] {
        if !dir.join(needed).is_file() {
            bail!("{} has no {needed}", dir.display());
        }
    }
    Ok(())
}

/// The MLX version in `include/mlx/version.h`, e.g. `0.32.4`.
pub fn version_of(dir: &Path) -> Result<String> {
    let header = dir.join("include/mlx/version.h");
    let text = std::fs::read_to_string(&header)
        .with_context(|| format!("cannot read {}", header.display()))?;
    parse_version(&text).with_context(|| format!("{}: no version", header.display()))
}

/// `major.minor.patch` from the `MLX_VERSION_*` defines of `version.h`.
fn parse_version(header: &str) -> Result<String> {
    let component = |name: &str| {
        header
            .lines()
            .filter_map(|line| line.trim().strip_prefix("#define "))
            .filter_map(|rest| rest.strip_prefix(name))
            .map(str::trim)
            .find(|value| !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()))
            .with_context(|| format!("no numeric {name}"))
    };
    Ok(format!(
        "{}.{}.{}",
        component("MLX_VERSION_MAJOR")?,
        component("MLX_VERSION_MINOR")?,
        component("MLX_VERSION_PATCH")?
    ))
}

/// Looks for MLX in order: `MLX_DIR` (which must then be valid), the record
/// of an earlier setup of `backend` (ignored, with a note, if stale), then a
/// Python `mlx` install. Prints where it found MLX.
pub fn discover(workspace: &Workspace, backend: Backend) -> Result<Option<Found>> {
    let found = find(workspace, backend)?;
    match &found {
        Some(found) => println!("MLX: found {} ({})", found.dir.display(), found.source),
        None => println!("MLX: no MLX_DIR, no setup record, no Python mlx install"),
    }
    Ok(found)
}

fn find(workspace: &Workspace, backend: Backend) -> Result<Option<Found>> {
    if let Some(dir) = std::env::var_os("MLX_DIR") {
        let dir = PathBuf::from(dir);
        check_layout(&dir).context("MLX_DIR does not point at an MLX install")?;
        return Ok(Some(Found {
            source: Source::EnvVar,
            dir,
        }));
    }
    match provisioned_dir(workspace, backend) {
        Ok(Some(dir)) => {
            return Ok(Some(Found {
                source: Source::Record,
                dir,
            }))
        }
        Ok(None) => {}
        Err(stale) => println!("MLX: ignoring the setup record: {stale:#}"),
    }
    Ok(python::mlx_package_dir()
        .filter(|dir| check_layout(dir).is_ok())
        .map(|dir| Found {
            source: Source::Python,
            dir,
        }))
}

/// The MLX folder the setup record names, if there is a record; an error if
/// it is unreadable or does not describe a usable `backend` install of
/// [`MLX_VERSION`].
fn provisioned_dir(workspace: &Workspace, backend: Backend) -> Result<Option<PathBuf>> {
    let Some(record) = Record::read(&workspace.mlx_record())? else {
        return Ok(None);
    };
    if record.version != MLX_VERSION || record.backend != backend.name() {
        bail!(
            "it is for MLX {} {}, and {MLX_VERSION} {backend} is wanted",
            record.version,
            record.backend
        );
    }
    check_layout(&record.mlx_dir)?;
    Ok(Some(record.mlx_dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_version_defines_and_skips_the_numeric_one() {
        let header = "#pragma once\n\
            #define MLX_VERSION_MAJOR 0\n\
            #define MLX_VERSION_MINOR 32\n\
            #define MLX_VERSION_PATCH 4\n\
            #define MLX_VERSION_NUMERIC \\\n  (100000 * MLX_VERSION_MAJOR)\n";
        assert_eq!(parse_version(header).unwrap(), "0.32.4");
    }

    #[test]
    fn a_header_without_a_patch_define_is_an_error() {
        let header = "#define MLX_VERSION_MAJOR 0\n#define MLX_VERSION_MINOR 32\n";
        let error = parse_version(header).unwrap_err();
        assert_eq!(error.to_string(), "no numeric MLX_VERSION_PATCH");
    }
}
