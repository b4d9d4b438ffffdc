//! What the tests on the default model share.

use std::path::{Path, PathBuf};

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
