//! Helpers shared by the crate's integration tests (the mlx-lm parity tests
//! `parity_*.rs`, `kv_quant_fidelity.rs`, `decode_step.rs`, `cache_model.rs`
//! and `gpu_kernels.rs`):
//!
//! - [`mlx_lm`] runs `tests/mlx_lm/reference.py` (mlx-lm 0.32.2) and reads
//!   what it wrote;
//! - [`ours`] runs crate `gemma`'s forward pass on the same schedules;
//! - [`diff`] compares logits and says where they differ most;
//! - [`models`] builds the tiny random model and loads the default model;
//! - [`fixed_steps`] feeds a tiny model through fixed-shape decode steps;
//! - [`gpu`] makes the GPU the default device for the GPU tests;
//! - [`blocks`] makes random GGUF blocks.
//!
//! Environment:
//! - `GEMMA_MLX_PYTHON`: the Python interpreter with mlx-lm 0.32.2 and mlx
//!   0.32.4 (default `<workspace>/target/py/venv/bin/python`, which
//!   `cargo xtask setup` creates). A missing interpreter fails the parity
//!   tests, saying so.
//! - `GEMMA_MLX_SKIP_PARITY=1`: the parity tests print `SKIPPED` and pass
//!   without running mlx-lm (for machines without the venv).
//! - `GEMMA_MLX_MODEL`: the GGUF file of the default model (default
//!   `<workspace>/target/model/gemma-3-270m-q4_k_m.gguf`).

#![allow(dead_code)] // each test binary uses a different part of this module

pub mod blocks;
pub mod diff;
pub mod fixed_steps;
pub mod gpu;
pub mod mlx_lm;
pub mod models;
pub mod ours;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

static MLX: Mutex<()> = Mutex::new(());

/// Holds the lock that runs one test binary's MLX work one test at a time:
/// the tests of a binary run on parallel threads, the machine has two cores,
/// and each forward pass already uses both.
pub fn serial() -> MutexGuard<'static, ()> {
    MLX.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Splits `ids` into consecutive chunks of the given sizes (which must add
/// up to at most `ids.len()`).
pub fn chunks(ids: &[u32], sizes: &[usize]) -> Vec<Vec<u32>> {
    let total: usize = sizes.iter().sum();
    assert!(
        total <= ids.len(),
        "the schedule needs {total} tokens, {} given",
        ids.len()
    );
    let mut start = 0;
    sizes
        .iter()
        .map(|&n| {
            start += n;
            ids[start - n..start].to_vec()
        })
        .collect()
}
