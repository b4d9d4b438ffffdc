//! Compiled kernels kept on disk between processes, so that NVRTC compiles
//! each program once per machine rather than once per process.
//!
//! Each program is stored as `FUNCTION.cu` (its source) and `FUNCTION.cubin`
//! (its binary). A binary is used only when the stored source equals the
//! program's, so a changed kernel, GPU or compiler never reuses a stale one.
//! Both files are written under temporary names and renamed into place, so
//! processes sharing the folder never read half a file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::{env, fs, process};

/// Where compiled kernels live: `GEMMA_MLX_KERNEL_CACHE` when set (empty
/// turns the cache off), else `$XDG_CACHE_HOME/gemma-mlx/kernels`, else
/// `$HOME/.cache/gemma-mlx/kernels`; `None` when none of these is set.
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_from(
        env::var_os("GEMMA_MLX_KERNEL_CACHE"),
        env::var_os("XDG_CACHE_HOME"),
        env::var_os("HOME"),
    )
}

/// [`cache_dir`] from the three variables' values.
fn cache_dir_from(
    explicit: Option<OsString>,
    xdg_cache_home: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    if let Some(dir) = explicit {
        return (!dir.is_empty()).then(|| PathBuf::from(dir));
    }
    let base = xdg_cache_home
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| home.map(|h| Path::new(&h).join(".cache")))?;
    Some(base.join("gemma-mlx").join("kernels"))
}

/// The binary stored in `dir` for the program `source` of `function`, if the
/// stored source is exactly `source`.
pub(crate) fn load(dir: &Path, function: &str, source: &str) -> Option<Vec<u8>> {
    let stored = fs::read_to_string(dir.join(format!("{function}.cu"))).ok()?;
    if stored != source {
        return None;
    }
    fs::read(dir.join(format!("{function}.cubin"))).ok()
}

/// Stores `binary` and `source` for `function` in `dir`. A cache that cannot
/// be written only costs a compile next time, so failures are returned for
/// the caller to report, never to stop on.
pub(crate) fn store(
    dir: &Path,
    function: &str,
    source: &str,
    binary: &[u8],
) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    // The binary first: a source in place means its binary is too.
    write_whole(&dir.join(format!("{function}.cubin")), binary)?;
    write_whole(&dir.join(format!("{function}.cu")), source.as_bytes())
}

/// Writes `bytes` to a temporary file beside `path`, then renames it there.
/// The temporary name is unique to the process and the call, so writers of
/// the same file never share one.
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(
        ".{}.{}.tmp",
        process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    fs::write(&temporary, bytes)?;
    fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_folder_follows_the_variables_in_order() {
        let some = |s: &str| Some(OsString::from(s));
        let dir = |explicit, xdg, home| cache_dir_from(explicit, xdg, home);
        assert_eq!(
            dir(some("/k"), some("/x"), some("/h")),
            Some(PathBuf::from("/k"))
        );
        assert_eq!(dir(some(""), some("/x"), some("/h")), None);
        assert_eq!(
            dir(None, some("/x"), some("/h")),
            Some(PathBuf::from("/x/gemma-mlx/kernels"))
        );
        assert_eq!(
            dir(None, some(""), some("/h")),
            Some(PathBuf::from("/h/.cache/gemma-mlx/kernels"))
        );
        assert_eq!(dir(None, None, None), None);
    }

    #[test]
    fn a_stored_binary_comes_back_only_for_the_same_source() {
        let dir = env::temp_dir().join(format!("mlx-core-kernel-cache-{}", process::id()));
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(load(&dir, "k_1", "source"), None);
        store(&dir, "k_1", "source", &[1, 2, 3]).unwrap();
        assert_eq!(load(&dir, "k_1", "source"), Some(vec![1, 2, 3]));
        assert_eq!(load(&dir, "k_1", "other source"), None);
        assert_eq!(load(&dir, "k_2", "source"), None);
        store(&dir, "k_1", "source", &[4]).unwrap();
        assert_eq!(load(&dir, "k_1", "source"), Some(vec![4]));
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
