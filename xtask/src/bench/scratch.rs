//! Scratch files of a bench run, in the system's temporary folder.

use std::path::PathBuf;

/// `gemma-mlx-bench-PID-NAME` in the system's temporary folder.
pub fn scratch_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gemma-mlx-bench-{}-{name}", std::process::id()))
}
