//! `target/mlx/provisioned.json`: what `cargo xtask setup` provisioned.
//!
//! `crates/mlx-sys/build.rs` reads its `mlx_dir` key.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The record of a provisioned MLX.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The MLX version, e.g. `0.32.4`.
    pub version: String,
    /// The backend, `cpu` or `cuda`.
    pub backend: String,
    /// The absolute path of the folder with `include/` and `lib/libmlx.so`.
    pub mlx_dir: PathBuf,
    /// The BLAS `libmlx.so` loads: `openblas`, `reference` or `other`.
    pub blas: String,
    /// The BLAS library file `libmlx.so` loads, symlinks resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blas_library: Option<PathBuf>,
}

impl Record {
    /// Reads the record at `path`; `None` if there is no file.
    pub fn read(path: &Path) -> Result<Option<Self>> {
        let text = match fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(error).with_context(|| format!("cannot read {}", path.display()))
            }
        };
        let record = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a setup record", path.display()))?;
        Ok(Some(record))
    }

    /// Writes the record to `path`, through a temporary file so that a
    /// reader never sees half of it.
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut text = serde_json::to_string_pretty(self)?;
        text.push('\n');
        let partial = path.with_extension("json.partial");
        fs::write(&partial, text).with_context(|| format!("cannot write {}", partial.display()))?;
        fs::rename(&partial, path)
            .with_context(|| format!("cannot move {} to {}", partial.display(), path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_record_without_blas_library() {
        let dir = std::env::temp_dir().join(format!("xtask-record-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("provisioned.json");
        fs::write(
            &path,
            r#"{"version":"0.32.4","backend":"cpu","mlx_dir":"/w/target/mlx/0.32.4-cpu/mlx","blas":"openblas"}"#,
        )
        .unwrap();
        let record = Record::read(&path).unwrap().unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            record,
            Record {
                version: "0.32.4".to_owned(),
                backend: "cpu".to_owned(),
                mlx_dir: PathBuf::from("/w/target/mlx/0.32.4-cpu/mlx"),
                blas: "openblas".to_owned(),
                blas_library: None,
            }
        );
    }

    #[test]
    fn writes_what_it_reads_back() {
        let dir = std::env::temp_dir().join(format!("xtask-record-rt-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("provisioned.json");
        let record = Record {
            version: "0.32.4".to_owned(),
            backend: "cuda".to_owned(),
            mlx_dir: PathBuf::from("/w/target/mlx/0.32.4-cuda/mlx"),
            blas: "reference".to_owned(),
            blas_library: Some(PathBuf::from("/w/libblas.so.3")),
        };
        record.write(&path).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        let back = Record::read(&path).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert!(text.contains(r#""mlx_dir": "/w/target/mlx/0.32.4-cuda/mlx""#));
        assert_eq!(back, Some(record));
    }

    #[test]
    fn a_missing_record_is_none() {
        let path = std::env::temp_dir().join("xtask-no-such-record/provisioned.json");
        assert_eq!(Record::read(&path).unwrap(), None);
    }
}
