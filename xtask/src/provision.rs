//! Downloading MLX's wheel from PyPI and unpacking it under `target/mlx/`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;

use crate::command;
use crate::discovery;
use crate::mlx_build::{Backend, MLX_VERSION};
use crate::python;
use crate::workspace::Workspace;

/// Downloads the `backend` wheel of MLX [`MLX_VERSION`] and unpacks it into
/// `target/mlx/<version>-<backend>/`, replacing what was there. Returns the
/// unpacked `mlx/` folder.
///
/// The CPU wheel is self-contained. The CUDA wheel's `libmlx.so` finds the
/// CUDA libraries in the `nvidia-*` wheels it depends on, unpacked beside it,
/// so those are downloaded and unpacked too.
pub fn provision(workspace: &Workspace, backend: Backend) -> Result<PathBuf> {
    let wheels = workspace.mlx_wheels(backend);
    fs::create_dir_all(&wheels).with_context(|| format!("cannot create {}", wheels.display()))?;
    download(backend, &wheels)?;

    let unpacked = workspace.mlx_unpacked(backend);
    let partial = PathBuf::from(format!("{}.partial", unpacked.display()));
    remove_dir_if_present(&partial)?;
    fs::create_dir_all(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
    for wheel in wheels_in(&wheels)? {
        unpack(&wheel, &partial)?;
    }
    remove_dir_if_present(&unpacked)?;
    fs::rename(&partial, &unpacked).with_context(|| {
        format!(
            "cannot move {} to {}",
            partial.display(),
            unpacked.display()
        )
    })?;

    let mlx_dir = unpacked.join("mlx");
    discovery::check_layout(&mlx_dir).with_context(|| {
        format!(
            "the {} wheel did not unpack as expected",
            backend.pip_package()
        )
    })?;
    Ok(mlx_dir)
}

/// Runs `pip download` for the backend's wheel into `dest`.
fn download(backend: Backend, dest: &Path) -> Result<()> {
    let requirement = format!("{}=={MLX_VERSION}", backend.pip_package());
    let dest_arg = dest.to_string_lossy();
    let mut args = vec!["download", "--only-binary=:all:", "--dest", &dest_arg];
    if backend == Backend::Cpu {
        args.push("--no-deps");
    }
    args.push(&requirement);
    command::run(&mut python::pip(&args)).with_context(|| {
        format!(
            "pip could not download {requirement}. It needs network access to PyPI (or pip's \
             configured index), and a wheel exists only for x86_64 and aarch64 Linux with \
             glibc 2.35 or newer. Alternatively set MLX_DIR to an MLX {MLX_VERSION} install"
        )
    })
}

/// The `.whl` files in `dir`, sorted by name.
fn wheels_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut wheels = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "whl") {
            wheels.push(path);
        }
    }
    if wheels.is_empty() {
        bail!("pip left no wheel in {}", dir.display());
    }
    wheels.sort();
    Ok(wheels)
}

/// Unpacks the wheel (a zip file) at `wheel` into `dest`, keeping unix
/// permissions.
fn unpack(wheel: &Path, dest: &Path) -> Result<()> {
    let name = wheel.file_name().map_or_else(
        || wheel.display().to_string(),
        |name| name.to_string_lossy().into_owned(),
    );
    let spinner = ProgressBar::new_spinner().with_message(format!("unpacking {name}"));
    spinner.enable_steady_tick(Duration::from_millis(120));
    println!("unpacking {name} into {}", dest.display());
    let file = fs::File::open(wheel).with_context(|| format!("cannot open {}", wheel.display()))?;
    let result = zip::ZipArchive::new(file).and_then(|mut archive| archive.extract(dest));
    spinner.finish_and_clear();
    result.with_context(|| format!("cannot unpack {}", wheel.display()))
}

/// Removes the folder `dir` and everything in it, if it exists.
fn remove_dir_if_present(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(error).with_context(|| format!("cannot remove {}", dir.display()))
        }
        _ => Ok(()),
    }
}
