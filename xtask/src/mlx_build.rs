//! The MLX this project builds against: the version its C API is written
//! for, and the backends whose PyPI wheels provide it.

use std::fmt;
use std::path::Path;

use clap::ValueEnum;

/// The MLX version this project's C API is written against.
pub const MLX_VERSION: &str = "0.32.4";

/// An MLX build: which PyPI wheel provides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The CPU-only build (`mlx-cpu`).
    Cpu,
    /// The CUDA 13 build (`mlx-cuda-13`).
    Cuda,
}

impl Backend {
    /// The backend's name in paths and the record.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }

    /// The PyPI package of this backend's wheel.
    pub fn pip_package(self) -> &'static str {
        match self {
            Backend::Cpu => "mlx-cpu",
            Backend::Cuda => "mlx-cuda-13",
        }
    }

    /// The folder, next to `mlx/`, holding the libraries the wheel bundles.
    pub fn bundled_libs(self) -> &'static str {
        match self {
            Backend::Cpu => "mlx_cpu.libs",
            Backend::Cuda => "mlx_cuda_13.libs",
        }
    }

    /// The backend whose wheel unpacked `mlx_dir`, told by the bundled-library
    /// folder next to it; `None` for an MLX built some other way.
    pub fn of_mlx_dir(mlx_dir: &Path) -> Option<Self> {
        let parent = mlx_dir.parent()?;
        [Backend::Cpu, Backend::Cuda]
            .into_iter()
            .find(|backend| parent.join(backend.bundled_libs()).is_dir())
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
