//! What the tests on the default model share.

// Each test file uses a different part of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

/// The default model's GGUF file: `GEMMA_MLX_MODEL`, or
/// `<workspace>/target/model/gemma-3-270m-q4_k_m.gguf`; panics, saying what
/// to do, when it is missing.
pub fn default_model_path() -> PathBuf {
    let path = std::env::var_os("GEMMA_MLX_MODEL").map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/model/gemma-3-270m-q4_k_m.gguf")
        },
        PathBuf::from,
    );
    assert!(
        path.is_file(),
        "the default model {} is missing: run `cargo xtask setup` (or set GEMMA_MLX_MODEL)",
        path.display()
    );
    path
}

/// stderr of a finished `gemma-mlx` run, as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The JSON object on the last line of stdout of a successful run.
pub fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "gemma-mlx failed ({}): {}",
        out.status,
        stderr(out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no output; stderr: {}", stderr(out)));
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("stdout's last line is not JSON ({e}): {line}"))
}
