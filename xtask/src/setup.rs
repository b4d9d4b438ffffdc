//! `cargo xtask setup`: MLX, its BLAS, the default model, the mlx-lm
//! reference Python environment and ggml's base library (an oracle).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::blas::{self, Blas, BlasKind};
use crate::discovery::{self, Found, Source};
use crate::ldd;
use crate::llama_build;
use crate::mlx_build::{Backend, MLX_VERSION};
use crate::mlx_lm_env::{self, Flavor, MlxLmEnv};
use crate::model;
use crate::provision;
use crate::python;
use crate::record::Record;
use crate::refract_env;
use crate::system;
use crate::workspace::Workspace;

/// What `setup` should do.
pub struct SetupOptions {
    /// The MLX build to provision.
    pub backend: Backend,
    /// Unpack MLX, assemble the model and create the reference Python
    /// environment again even if they are present.
    pub force: bool,
    /// Whether to fetch the default model.
    pub model: bool,
    /// Whether to set up the mlx-lm reference Python environment.
    pub reference: bool,
    /// Whether MLX may be downloaded; if not, an existing install is used.
    pub provision: bool,
}

/// The MLX install setup settled on.
struct Mlx {
    source: Source,
    dir: PathBuf,
    backend: Option<Backend>,
    version: String,
    blas: Blas,
}

/// Runs setup: checks Python and pip, finds or provisions MLX (putting
/// OpenBLAS behind a provisioned CPU build), fetches the default model and
/// sets up the mlx-lm reference Python environment (with OpenBLAS behind its
/// MLX too) unless told not to, and prints a summary. Does nothing that is
/// already done.
pub fn run(workspace: &Workspace, options: &SetupOptions) -> Result<()> {
    system::check_platform()?;
    python::check()?;
    let mlx = ensure_mlx(workspace, options)?;
    let model = if options.model {
        Some(model::ensure(workspace, options.force)?)
    } else {
        None
    };
    let reference = if options.reference {
        Some(mlx_lm_env::ensure(
            workspace,
            Flavor::Reference,
            options.force,
        )?)
    } else {
        None
    };
    let refract = match &reference {
        Some(env) => Some(refract_env::ensure(workspace, &env.python)?),
        None => None,
    };
    let ggml = if options.reference {
        Some(llama_build::ensure_library(
            workspace,
            &llama_build::STOCK,
            llama_build::GGML_BASE,
        )?)
    } else {
        None
    };
    print_summary(&mlx, model.as_deref(), reference.as_ref());
    match refract {
        Some(line) => println!("  REFRACT  {line}"),
        None => println!("  REFRACT  skipped (--no-reference)"),
    }
    match ggml {
        Some(path) => println!("  ggml     {} (the iq4_nl oracle)", path.display()),
        None => println!("  ggml     skipped (--no-reference)"),
    }
    Ok(())
}

/// Finds MLX, or provisions it, and reports its BLAS.
fn ensure_mlx(workspace: &Workspace, options: &SetupOptions) -> Result<Mlx> {
    let found = discovery::discover(workspace, options.backend)?;
    let reprovision = options.force && options.provision;
    match found {
        Some(found) if found.source == Source::EnvVar => {
            if options.force {
                println!("MLX: MLX_DIR is set, so --force leaves MLX alone");
            }
            describe_existing(found)
        }
        Some(found) if found.source == Source::Record && !reprovision => {
            println!("MLX: already provisioned");
            finish_provisioned(workspace, options.backend, found.dir)
        }
        Some(found) if found.source == Source::Python && !options.provision => {
            describe_existing(found)
        }
        found => {
            if !options.provision {
                bail!(
                    "no MLX to use: set MLX_DIR to an MLX {MLX_VERSION} install, install the \
                     Python package ({}=={MLX_VERSION}), or run `cargo xtask setup` without \
                     --no-provision",
                    options.backend.pip_package()
                );
            }
            if found.is_some_and(|found| found.source == Source::Python) {
                println!(
                    "MLX: provisioning a copy under target/ rather than using the Python \
                     install (pass --no-provision to use that one)"
                );
            }
            println!(
                "MLX: provisioning {}=={MLX_VERSION}",
                options.backend.pip_package()
            );
            let dir = provision::provision(workspace, options.backend)?;
            finish_provisioned(workspace, options.backend, dir)
        }
    }
}

/// For setup's own copy of MLX at `dir`: puts OpenBLAS behind the CPU
/// backend and (re)writes the record when it changed.
fn finish_provisioned(workspace: &Workspace, backend: Backend, dir: PathBuf) -> Result<Mlx> {
    let libmlx = discovery::libmlx(&dir);
    if backend == Backend::Cpu {
        let unpacked = dir
            .parent()
            .with_context(|| format!("{} has no parent folder", dir.display()))?;
        let libs = unpacked.join(backend.bundled_libs());
        blas::link_openblas(&libs, &libmlx)?;
    }
    let blas = blas::resolve(&libmlx)?;
    let record = Record {
        version: MLX_VERSION.to_owned(),
        backend: backend.name().to_owned(),
        mlx_dir: dir.clone(),
        blas: blas.kind.name().to_owned(),
        blas_library: blas.library.clone(),
    };
    let path = workspace.mlx_record();
    if Record::read(&path).ok().flatten().as_ref() != Some(&record) {
        record.write(&path)?;
        println!("MLX: wrote {}", path.display());
    }
    warn_unresolved(&libmlx)?;
    Ok(Mlx {
        source: Source::Record,
        dir,
        backend: Some(backend),
        version: MLX_VERSION.to_owned(),
        blas,
    })
}

/// For an install setup does not own (MLX_DIR, Python): reports it as is.
fn describe_existing(found: Found) -> Result<Mlx> {
    let libmlx = found.libmlx();
    let version = discovery::version_of(&found.dir)?;
    if version != MLX_VERSION {
        println!("MLX: warning: this is MLX {version}; mlx-c is written against {MLX_VERSION}");
    }
    let blas = blas::resolve(&libmlx)?;
    if blas.kind == BlasKind::Reference {
        println!(
            "MLX: note: this libmlx.so loads the reference BLAS its wheel bundles, more than 10 \
             times slower at float32 matmul than OpenBLAS, and setup leaves it alone; \
             `cargo xtask setup` without MLX_DIR or --no-provision provisions a copy that uses \
             OpenBLAS"
        );
    }
    warn_unresolved(&libmlx)?;
    Ok(Mlx {
        source: found.source,
        backend: Backend::of_mlx_dir(&found.dir),
        dir: found.dir,
        version,
        blas,
    })
}

/// Warns about libraries `libmlx` needs that the loader cannot find (for
/// the CUDA build, `libcuda.so.1` comes with the NVIDIA driver).
fn warn_unresolved(libmlx: &Path) -> Result<()> {
    let missing = ldd::unresolved(libmlx)?;
    if !missing.is_empty() {
        println!(
            "MLX: warning: {} needs libraries the loader cannot find: {}",
            libmlx.display(),
            missing.join(", ")
        );
    }
    Ok(())
}

fn print_summary(mlx: &Mlx, model: Option<&Path>, reference: Option<&MlxLmEnv>) {
    let backend = mlx
        .backend
        .map_or("unknown (not built from a PyPI wheel)", Backend::name);
    println!();
    println!("setup done");
    println!("  MLX      {} ({})", mlx.dir.display(), mlx.source);
    println!("  backend  {backend}");
    println!("  version  {}", mlx.version);
    println!("  BLAS     {}", mlx.blas);
    match model {
        Some(model) => println!("  model    {}", model.display()),
        None => println!("  model    skipped (--no-model)"),
    }
    match reference {
        Some(reference) => println!("  mlx-lm   {reference}"),
        None => println!("  mlx-lm   skipped (--no-reference)"),
    }
    if let Some(other) = std::env::var_os("GEMMA_MLX_MODEL") {
        println!(
            "  GEMMA_MLX_MODEL={} (tests use it instead of the default model)",
            Path::new(&other).display()
        );
    }
}
