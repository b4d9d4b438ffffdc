//! The BLAS behind MLX's CPU backend: which one `libmlx.so` loads, and
//! putting OpenBLAS in place of the wheel's bundled reference BLAS.
//!
//! The wheels' `libmlx.so` loads `libblas-*.so.3.10.0` and
//! `liblapack-*.so.3.10.0` from the bundled-library folder next to `mlx/`
//! (through its RPATH). Those are the reference implementations, more than 10
//! times slower at float32 matmul than OpenBLAS, so setup replaces them in
//! its own copy (never in `MLX_DIR` or a Python install) with symlinks to
//! Debian's OpenBLAS.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::command;
use crate::ldd;
use crate::system;

/// What kind of BLAS a `libmlx.so` loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlasKind {
    /// OpenBLAS.
    OpenBlas,
    /// The reference BLAS a wheel bundles.
    Reference,
    /// Some other BLAS library.
    Other,
    /// A BLAS library `libmlx.so` needs but the loader cannot find.
    NotFound,
    /// No BLAS library among `libmlx.so`'s dependencies.
    None,
}

impl BlasKind {
    /// The kind's name in the setup record.
    pub fn name(self) -> &'static str {
        match self {
            BlasKind::OpenBlas => "openblas",
            BlasKind::Reference => "reference",
            BlasKind::Other => "other",
            BlasKind::NotFound => "not found",
            BlasKind::None => "none",
        }
    }
}

/// The BLAS a `libmlx.so` loads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blas {
    /// Its kind.
    pub kind: BlasKind,
    /// The library file, symlinks resolved.
    pub library: Option<PathBuf>,
}

impl fmt::Display for Blas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let description = match self.kind {
            BlasKind::OpenBlas => "OpenBLAS",
            BlasKind::Reference => "the wheel's bundled reference BLAS (slow)",
            BlasKind::Other => "another BLAS",
            BlasKind::NotFound => "a BLAS library the loader cannot find",
            BlasKind::None => "no separate BLAS library",
        };
        match &self.library {
            Some(library) => write!(f, "{description}: {}", library.display()),
            None => f.write_str(description),
        }
    }
}

/// The BLAS the `libmlx.so` at `libmlx` loads.
pub fn resolve(libmlx: &Path) -> Result<Blas> {
    let dependencies = ldd::dependencies(libmlx)?;
    let blas = ["libblas", "libopenblas", "libmkl_rt", "libflexiblas"]
        .iter()
        .find_map(|prefix| dependencies.iter().find(|d| d.name.starts_with(prefix)));
    let Some(blas) = blas else {
        return Ok(Blas {
            kind: BlasKind::None,
            library: None,
        });
    };
    let Some(path) = &blas.path else {
        return Ok(Blas {
            kind: BlasKind::NotFound,
            library: Some(PathBuf::from(&blas.name)),
        });
    };
    let library = path.canonicalize().unwrap_or_else(|_| path.clone());
    let in_wheel_libs = library
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|folder| folder.to_string_lossy().ends_with(".libs"));
    let kind = if library.to_string_lossy().contains("openblas") {
        BlasKind::OpenBlas
    } else if in_wheel_libs {
        BlasKind::Reference
    } else {
        BlasKind::Other
    };
    Ok(Blas {
        kind,
        library: Some(library),
    })
}

/// The suffix of the bundled reference libraries set aside by [`link_openblas`].
const SET_ASIDE: &str = ".reference";

/// A bundled library replaced by a symlink, and where the original went.
struct Replaced {
    bundled: PathBuf,
    set_aside: PathBuf,
}

/// Replaces the reference BLAS and LAPACK in `libs_dir` (a wheel's bundled
/// libraries) with symlinks to Debian's OpenBLAS, installing it as root if
/// it is missing, and checks that `libmlx` then loads it. Does nothing when
/// the symlinks are already in place.
pub fn link_openblas(libs_dir: &Path, libmlx: &Path) -> Result<()> {
    let openblas = PathBuf::from(format!("/usr/lib/{}/openblas-pthread", system::multiarch()));
    let links = [
        ("libblas-", openblas.join("libblas.so.3")),
        ("liblapack-", openblas.join("liblapack.so.3")),
    ];
    system::ensure_debian_package(
        "libopenblas0-pthread",
        "a fast BLAS for MLX's CPU backend",
        &|| links.iter().all(|(_, target)| target.is_file()),
    )?;
    let mut replaced = Vec::new();
    for (prefix, target) in &links {
        let bundled = bundled_library(libs_dir, prefix)?;
        if fs::read_link(&bundled).is_ok_and(|current| &current == target) {
            continue;
        }
        let set_aside = PathBuf::from(format!("{}{SET_ASIDE}", bundled.display()));
        if bundled.is_symlink() {
            fs::remove_file(&bundled)
        } else {
            fs::rename(&bundled, &set_aside)
        }
        .with_context(|| format!("cannot move {} aside", bundled.display()))?;
        std::os::unix::fs::symlink(target, &bundled).with_context(|| {
            format!("cannot link {} to {}", bundled.display(), target.display())
        })?;
        println!("BLAS: {} -> {}", bundled.display(), target.display());
        replaced.push(Replaced { bundled, set_aside });
    }
    if let Err(error) = check_loads_openblas(libmlx) {
        restore(&replaced)?;
        return Err(error.context(
            "OpenBLAS does not work in place of the bundled BLAS; restored the bundled one",
        ));
    }
    Ok(())
}

/// The one library in `libs_dir` whose name starts with `prefix`.
fn bundled_library(libs_dir: &Path, prefix: &str) -> Result<PathBuf> {
    let entries =
        fs::read_dir(libs_dir).with_context(|| format!("cannot list {}", libs_dir.display()))?;
    let mut matches = Vec::new();
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) && !name.ends_with(SET_ASIDE) {
            matches.push(libs_dir.join(name));
        }
    }
    match <[PathBuf; 1]>::try_from(matches) {
        Ok([library]) => Ok(library),
        Err(matches) => bail!(
            "{} should hold one {prefix}* library, and holds {}",
            libs_dir.display(),
            matches.len()
        ),
    }
}

/// Fails unless every library and symbol `libmlx` needs resolves and its
/// BLAS is OpenBLAS.
fn check_loads_openblas(libmlx: &Path) -> Result<()> {
    let report = command::stdout_of(Command::new("ldd").arg("-r").arg(libmlx))?;
    let problems: Vec<&str> = report
        .lines()
        .map(str::trim)
        .filter(|line| line.contains("not found") || line.starts_with("undefined symbol"))
        .collect();
    if !problems.is_empty() {
        bail!(
            "{} does not load cleanly:\n  {}",
            libmlx.display(),
            problems.join("\n  ")
        );
    }
    let blas = resolve(libmlx)?;
    if blas.kind != BlasKind::OpenBlas {
        bail!("{} loads {blas}, not OpenBLAS", libmlx.display());
    }
    Ok(())
}

/// Puts the set-aside bundled libraries back.
fn restore(replaced: &[Replaced]) -> Result<()> {
    for Replaced { bundled, set_aside } in replaced {
        fs::remove_file(bundled).with_context(|| format!("cannot remove {}", bundled.display()))?;
        if set_aside.exists() {
            fs::rename(set_aside, bundled)
                .with_context(|| format!("cannot restore {}", bundled.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_bundled_library_and_skips_the_set_aside_one() {
        let dir = std::env::temp_dir().join(format!("xtask-blas-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        for name in [
            "libblas-bd8a282c.so.3.10.0",
            "libblas-bd8a282c.so.3.10.0.reference",
            "liblapack-86b2c207.so.3.10.0",
        ] {
            fs::write(dir.join(name), b"").unwrap();
        }
        let blas = bundled_library(&dir, "libblas-");
        let missing = bundled_library(&dir, "libgfortran-");
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(blas.unwrap(), dir.join("libblas-bd8a282c.so.3.10.0"));
        assert_eq!(
            missing.unwrap_err().to_string(),
            format!(
                "{} should hold one libgfortran-* library, and holds 0",
                dir.display()
            )
        );
    }
}
