//! What a shared library loads, as `ldd` reports it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::command;

/// A library another one needs, and where the loader finds it.
pub struct Dependency {
    /// The needed name, e.g. `libblas.so.3`.
    pub name: String,
    /// Where it resolves; `None` when the loader cannot find it.
    pub path: Option<PathBuf>,
}

/// The libraries `ldd` says `library` loads, directly or not.
pub fn dependencies(library: &Path) -> Result<Vec<Dependency>> {
    let output = command::stdout_of(Command::new("ldd").arg(library))
        .with_context(|| format!("cannot list what {} loads", library.display()))?;
    Ok(parse(&output))
}

/// The `name => path (address)` and `name => not found` lines of `ldd`'s output.
fn parse(output: &str) -> Vec<Dependency> {
    output
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().split_once(" => ")?;
            let path = rest.split_once(" (").map_or(rest, |(path, _)| path).trim();
            Some(Dependency {
                name: name.to_owned(),
                path: (path != "not found").then(|| PathBuf::from(path)),
            })
        })
        .collect()
}

/// The names of the libraries `library` needs that the loader cannot find.
pub fn unresolved(library: &Path) -> Result<Vec<String>> {
    Ok(dependencies(library)?
        .into_iter()
        .filter(|dependency| dependency.path.is_none())
        .map(|dependency| dependency.name)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_resolved_missing_and_address_only_lines() {
        let output = "\tlinux-vdso.so.1 (0x00007ffd5a1f2000)\n\
            \tlibblas-bd8a282c.so.3.10.0 => /w/target/mlx/0.32.4-cpu/mlx/lib/../../mlx_cpu.libs/libblas-bd8a282c.so.3.10.0 (0x00007f8fce956000)\n\
            \tlibcuda.so.1 => not found\n\
            \t/lib64/ld-linux-x86-64.so.2 (0x00007f8fcfb3f000)\n";
        let parsed = parse(output);
        let lines: Vec<(&str, Option<&Path>)> = parsed
            .iter()
            .map(|d| (d.name.as_str(), d.path.as_deref()))
            .collect();
        assert_eq!(
            lines,
            [
                (
                    "libblas-bd8a282c.so.3.10.0",
                    Some(Path::new(
                        "/w/target/mlx/0.32.4-cpu/mlx/lib/../../mlx_cpu.libs/libblas-bd8a282c.so.3.10.0"
                    ))
                ),
                ("libcuda.so.1", None),
            ]
        );
    }
}
