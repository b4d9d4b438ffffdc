//! A per-process scratch folder for readers that only open files by path
//! (GGUF, safetensors, `tokenizer.json`, `config.json`).
//!
//! The folder is `$GEMMA_FUZZ_SCRATCH` when set (`cargo xtask fuzz` sets it
//! and removes it afterwards), else `/dev/shm/gemma-fuzz-<pid>` where
//! `/dev/shm` exists (memory, so writing an input costs microseconds), else
//! `<temp dir>/gemma-fuzz-<pid>`. Files are overwritten by each input.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The scratch folder, created on first use.
pub fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = std::env::var_os("GEMMA_FUZZ_SCRATCH").map_or_else(
            || {
                let shm = Path::new("/dev/shm");
                let root = if shm.is_dir() {
                    shm.to_path_buf()
                } else {
                    std::env::temp_dir()
                };
                root.join(format!("gemma-fuzz-{}", std::process::id()))
            },
            PathBuf::from,
        );
        std::fs::create_dir_all(&base).expect("cannot create the fuzz scratch folder");
        base
    })
}

/// Writes `bytes` to the file `name` in the scratch folder and returns its path.
pub fn write(name: &str, bytes: &[u8]) -> PathBuf {
    write_in(dir(), name, bytes)
}

/// A fresh, empty subfolder `name` of the scratch folder.
pub fn empty_subdir(name: &str) -> PathBuf {
    let path = dir().join(name);
    // Absent the first time: nothing to remove then.
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).expect("cannot create a scratch subfolder");
    path
}

/// Writes `bytes` to `folder/name` and returns the path.
pub fn write_in(folder: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = folder.join(name);
    std::fs::write(&path, bytes).expect("cannot write a scratch file");
    path
}
