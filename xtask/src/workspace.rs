//! Where things live, relative to the workspace root (not the current folder).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::mlx_build::{Backend, MLX_VERSION};

/// The workspace root and the paths the tasks read and write under it.
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// The workspace holding this xtask crate (its manifest folder's parent).
    pub fn locate() -> Result<Self> {
        let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = manifest_dir
            .parent()
            .with_context(|| format!("{} has no parent folder", manifest_dir.display()))?;
        let root = root
            .canonicalize()
            .with_context(|| format!("{}: cannot resolve the workspace root", root.display()))?;
        Ok(Self { root })
    }

    /// The workspace root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `target/mlx`: everything MLX-related that setup provisions.
    fn mlx_root(&self) -> PathBuf {
        self.root.join("target/mlx")
    }

    /// `target/mlx/provisioned.json`: the record of the provisioned MLX.
    pub fn mlx_record(&self) -> PathBuf {
        self.mlx_root().join("provisioned.json")
    }

    /// `target/mlx/wheels/<version>-<backend>`: the downloaded wheels.
    pub fn mlx_wheels(&self, backend: Backend) -> PathBuf {
        self.mlx_root()
            .join("wheels")
            .join(format!("{MLX_VERSION}-{backend}"))
    }

    /// `target/mlx/<version>-<backend>`: the unpacked wheels.
    pub fn mlx_unpacked(&self, backend: Backend) -> PathBuf {
        self.mlx_root().join(format!("{MLX_VERSION}-{backend}"))
    }

    /// `target/model`: the default model and the packages it comes from.
    pub fn model_root(&self) -> PathBuf {
        self.root.join("target/model")
    }

    /// `target/py`: the Python environments with mlx-lm.
    pub fn py_root(&self) -> PathBuf {
        self.root.join("target/py")
    }

    /// `crates/engine/examples`: the examples for users of the crates.
    pub fn engine_examples(&self) -> PathBuf {
        self.root.join("crates/engine/examples")
    }

    /// The C header the bindings are generated from.
    pub fn c_header(&self) -> PathBuf {
        self.root.join("mlx-c/include/mlx_c.h")
    }

    /// The committed, generated Rust bindings.
    pub fn bindings(&self) -> PathBuf {
        self.root.join("crates/mlx-sys/src/bindings.rs")
    }
}
