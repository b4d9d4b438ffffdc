//! The Python virtual environments with mlx-lm under `target/py/`.
//!
//! - [`Flavor::Reference`], `target/py/venv`: mlx-lm 0.32.2 on MLX 0.32.4's
//!   CPU wheel, with the wheel's reference BLAS replaced by OpenBLAS as for
//!   setup's own MLX, and gguf-py 0.17.1 (the oracle of ggml's block
//!   quantizers). The parity tests run it (env `GEMMA_MLX_PYTHON`
//!   overrides), and `bench` compares against it with the same settings.
//! - [`Flavor::Shipped`], `target/py/venv-shipped`: mlx-lm 0.32.2 as a Linux
//!   user gets it (`pip install 'mlx[cpu]' mlx-lm`), BLAS untouched; only
//!   `bench` uses it.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::blas::{self, Blas};
use crate::command;
use crate::discovery;
use crate::mlx_build::{Backend, MLX_VERSION};
use crate::python;
use crate::system;
use crate::workspace::Workspace;

/// The mlx-lm release the references and benchmarks use.
pub const MLX_LM_VERSION: &str = "0.32.2";

/// The gguf-py release whose quantizers the KV block tests compare with.
pub const GGUF_PY_VERSION: &str = "0.17.1";

/// Which of the two mlx-lm environments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Pinned MLX, OpenBLAS: the same settings as this project.
    Reference,
    /// Whatever `pip install 'mlx[cpu]'` gives, with the wheel's own BLAS.
    Shipped,
}

impl Flavor {
    /// The venv's folder under `target/py/`.
    fn folder(self) -> &'static str {
        match self {
            Flavor::Reference => "venv",
            Flavor::Shipped => "venv-shipped",
        }
    }

    /// What to ask pip for.
    fn requirements(self) -> Vec<String> {
        let mlx = match self {
            Flavor::Reference => format!("mlx[cpu]=={MLX_VERSION}"),
            Flavor::Shipped => "mlx[cpu]".to_owned(),
        };
        let mut requirements = vec![mlx, format!("mlx-lm=={MLX_LM_VERSION}"), "numpy".to_owned()];
        if self == Flavor::Reference {
            requirements.push(format!("gguf=={GGUF_PY_VERSION}"));
        }
        requirements
    }

    /// Whether an environment with `installed` is what this flavour wants.
    fn accepts(self, installed: &Installed) -> bool {
        installed.mlx_lm == MLX_LM_VERSION
            && (self == Flavor::Shipped
                || (installed.mlx == MLX_VERSION
                    && installed.gguf.as_deref() == Some(GGUF_PY_VERSION)))
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flavor::Reference => "reference Python environment",
            Flavor::Shipped => "as-shipped Python environment",
        })
    }
}

/// A ready mlx-lm environment.
#[derive(Clone, Debug)]
pub struct MlxLmEnv {
    /// Its `bin/python`.
    pub python: PathBuf,
    /// The mlx-lm version it imports.
    pub mlx_lm: String,
    /// The MLX version it imports.
    pub mlx: String,
    /// The BLAS its `libmlx.so` loads.
    pub blas: Blas,
}

impl fmt::Display for MlxLmEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (mlx-lm {}, mlx {}; BLAS {})",
            self.python.display(),
            self.mlx_lm,
            self.mlx,
            self.blas
        )
    }
}

/// What a venv's Python imports, as [`PROBE`] prints it.
#[derive(Debug, Deserialize)]
struct Installed {
    mlx_lm: String,
    mlx: String,
    mlx_dir: PathBuf,
    /// gguf-py's version, when it is installed.
    gguf: Option<String>,
}

/// Prints the versions of mlx-lm, MLX and gguf-py (null when absent), and
/// MLX's package folder, as JSON.
const PROBE: &str = "import json, importlib.metadata as m, mlx, mlx.core, mlx_lm\n\
    try:\n    gguf = m.version('gguf')\nexcept m.PackageNotFoundError:\n    gguf = None\n\
    print(json.dumps({'mlx_lm': mlx_lm.__version__, 'mlx': mlx.core.__version__, \
    'mlx_dir': list(mlx.__path__)[0], 'gguf': gguf}))";

/// Makes sure the `flavor` venv exists with the packages it wants, creating
/// it or installing into it as needed (`force`: from scratch), and for the
/// reference one puts OpenBLAS behind its MLX. Returns what it holds.
pub fn ensure(workspace: &Workspace, flavor: Flavor, force: bool) -> Result<MlxLmEnv> {
    let venv = workspace.py_root().join(flavor.folder());
    let python = venv.join("bin/python");
    if force {
        remove_venv(&venv)?;
    }
    let installed = match probe(&python) {
        Some(installed) if flavor.accepts(&installed) => {
            println!("{flavor}: already set up");
            installed
        }
        _ => {
            install(flavor, &venv, &python)?;
            probe(&python)
                .filter(|installed| flavor.accepts(installed))
                .with_context(|| {
                    format!(
                        "{}: installed {}, and it still does not import mlx-lm {MLX_LM_VERSION}{}",
                        venv.display(),
                        flavor.requirements().join(" "),
                        if flavor == Flavor::Reference {
                            format!(" with mlx {MLX_VERSION} and gguf {GGUF_PY_VERSION}")
                        } else {
                            String::new()
                        }
                    )
                })?
        }
    };
    let libmlx = discovery::libmlx(&installed.mlx_dir);
    if flavor == Flavor::Reference {
        let libs = installed
            .mlx_dir
            .parent()
            .with_context(|| format!("{} has no parent folder", installed.mlx_dir.display()))?
            .join(Backend::Cpu.bundled_libs());
        blas::link_openblas(&libs, &libmlx)
            .with_context(|| format!("{flavor}: cannot put OpenBLAS behind its MLX"))?;
    }
    Ok(MlxLmEnv {
        python,
        mlx_lm: installed.mlx_lm,
        mlx: installed.mlx,
        blas: blas::resolve(&libmlx)?,
    })
}

/// What the venv's `python` imports; `None` if it does not run or lacks a package.
fn probe(python: &Path) -> Option<Installed> {
    if !python.exists() {
        return None;
    }
    let output = command::capture(Command::new(python).args(["-c", PROBE])).ok()?;
    if !output.status.success() {
        return None;
    }
    serde_json::from_slice(&output.stdout).ok()
}

/// Creates the venv at `venv` (keeping one that is there) and pip-installs
/// the flavour's requirements into it, with pip's progress shown.
fn install(flavor: Flavor, venv: &Path, python: &Path) -> Result<()> {
    println!("{flavor}: creating {}", venv.display());
    system::ensure_debian_package("python3-venv", "the mlx-lm Python environment", &venv_works)?;
    if let Some(parent) = venv.parent() {
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let venv_arg = venv.to_string_lossy();
    command::run(&mut python::python(&["-m", "venv", &venv_arg]))
        .with_context(|| format!("cannot create a Python venv at {}", venv.display()))?;
    let requirements = flavor.requirements();
    let mut pip = Command::new(python);
    pip.args(["-m", "pip", "install", "--progress-bar", "on"])
        .args(&requirements)
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1");
    command::run(&mut pip).with_context(|| {
        format!(
            "pip could not install {} into {}; it needs network access to PyPI",
            requirements.join(" "),
            venv.display()
        )
    })
}

/// Whether `python3 -m venv` can create a venv with pip (Debian ships
/// `ensurepip` separately, in `python3-venv`).
fn venv_works() -> bool {
    command::capture(&mut python::python(&["-c", "import venv, ensurepip"]))
        .is_ok_and(|output| output.status.success())
}

/// Removes the venv at `venv`: only the link if it is a symlink, so a venv
/// it points to elsewhere is left alone.
fn remove_venv(venv: &Path) -> Result<()> {
    let result = if venv.is_symlink() {
        fs::remove_file(venv)
    } else {
        fs::remove_dir_all(venv)
    };
    match result {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(error).with_context(|| format!("cannot remove {}", venv.display()))
        }
        _ => Ok(()),
    }
}
