//! The llama.cpp trees vendored in `../shared/llamacpp/` (stock llama.cpp
//! and its TurboQuant fork), each built once under `target/` for this CPU
//! with cmake (Debian's, or PyPI's wheel when the machine has none). A
//! clone without that folder takes stock llama.cpp from PyPI: the source
//! distribution of llama-cpp-python 0.3.36 vendors llama.cpp at the same
//! commit, 0c1e570.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::command;
use crate::python;
use crate::workspace::Workspace;

/// Threads of every llama.cpp run here: one a core.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// A vendored tree and how it is built here.
pub struct LlamaTree {
    /// What it is, for messages.
    pub name: &'static str,
    /// Its tarball in `../shared/llamacpp/` (the tree inside is `llama.cpp/`).
    pub tarball: &'static str,
    /// Its folder under `target/`.
    pub folder: &'static str,
    /// cmake's configuration flags besides the common ones.
    pub flags: &'static [&'static str],
    /// How long its build takes on 2 cores, for the message.
    pub build_time: &'static str,
    /// Where the same source is on PyPI, for a clone without `../shared`.
    pub pypi: Option<PypiSource>,
}

/// A tree inside a source distribution on PyPI.
pub struct PypiSource {
    /// The file's address.
    pub url: &'static str,
    /// Its sha256.
    pub sha256: &'static str,
    /// The tree's folder inside the archive.
    pub folder: &'static str,
}

/// Stock llama.cpp at 0c1e570, built for this CPU (`GGML_NATIVE=ON`) but
/// without AMX on x86-64: on a Xeon whose flags list AMX but whose system
/// does not grant the tiles (a virtual machine), `llama-bench` built with
/// them died of SIGILL in ggml's AMX kernel (`tilezero`).
pub const STOCK: LlamaTree = LlamaTree {
    name: "llama.cpp 0c1e570",
    tarball: "llama.cpp-0c1e570.tar.xz",
    folder: "llamacpp",
    flags: &["-DGGML_NATIVE=ON"],
    build_time: "about 9 minutes",
    pypi: Some(PypiSource {
        url: "https://files.pythonhosted.org/packages/ec/e9/\
              e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/\
              llama_cpp_python-0.3.36.tar.gz",
        sha256: "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
        folder: "llama_cpp_python-0.3.36/vendor/llama.cpp",
    }),
};

/// The TurboQuant fork (TheTom/llama-cpp-turboquant at 69d8e4b), built for
/// AVX2 as `../shared/llamacpp/build-fork.sh cpu` builds it (its
/// `GGML_NATIVE=ON` build died with "Illegal instruction" on an AVX-512
/// Xeon).
pub const FORK: LlamaTree = LlamaTree {
    name: "llama-cpp-turboquant 69d8e4b",
    tarball: "llama-cpp-turboquant-69d8e4b.tar.xz",
    folder: "llama-fork",
    flags: &[
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON",
        "-DGGML_FMA=ON",
        "-DGGML_F16C=ON",
        "-DGGML_BMI2=ON",
        "-DLLAMA_OPENSSL=OFF",
    ],
    build_time: "about 8 minutes",
    pypi: None,
};

/// ggml's base library (its reference quantizers among it), the oracle of
/// the block formats the `gguf` Python package lacks (`iq4_nl`).
pub const GGML_BASE: &str = "ggml-base";

/// The folder of `tree`'s programs, building `targets` first unless they
/// are all there.
pub fn ensure_built(workspace: &Workspace, tree: &LlamaTree, targets: &[&str]) -> Result<PathBuf> {
    build(workspace, tree, targets, |bin, t| bin.join(t))
}

/// The shared library that cmake target `target` of `tree` makes
/// (`lib<target>.so`), building it first unless it is there. The library
/// comes from ggml's own build, which compiles it for x86-64 without
/// `-march` whatever `tree`'s flags say for the CPU backend.
pub fn ensure_library(workspace: &Workspace, tree: &LlamaTree, target: &str) -> Result<PathBuf> {
    let bin = build(workspace, tree, &[target], |bin, t| {
        bin.join(format!("lib{t}.so"))
    })?;
    Ok(bin.join(format!("lib{target}.so")))
}

/// Builds `targets` of `tree` unless every `product(bin, target)` exists;
/// returns the build's `bin` folder.
fn build(
    workspace: &Workspace,
    tree: &LlamaTree,
    targets: &[&str],
    product: impl Fn(&Path, &str) -> PathBuf,
) -> Result<PathBuf> {
    let dir = workspace.root().join("target").join(tree.folder);
    let source = dir.join("llama.cpp");
    let bin = source.join("build/bin");
    if targets.iter().all(|t| product(&bin, t).is_file()) {
        return Ok(bin);
    }
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if !source.is_dir() {
        unpack(workspace, tree, &dir)?;
    }
    let cmake = cmake(&dir)?;
    println!(
        "building {} of {} for this CPU (all its programs take {} on 2 cores)",
        targets.join(", "),
        tree.name,
        tree.build_time
    );
    command::run(
        Command::new(&cmake)
            .current_dir(&source)
            .args(["-B", "build", "-DCMAKE_BUILD_TYPE=Release"])
            .args([
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_SERVER=OFF",
                "-DLLAMA_CURL=OFF",
            ])
            .args(tree.flags)
            .args(without_amx(tree)),
    )?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    command::run(
        Command::new(&cmake)
            .current_dir(&source)
            .args(["--build", "build", "-j", &jobs.to_string(), "--target"])
            .args(targets),
    )?;
    if let Some(missing) = targets.iter().find(|t| !product(&bin, t).is_file()) {
        bail!("the {} build did not produce {missing}", tree.name);
    }
    Ok(bin)
}

/// Unpacks `tree`'s source into `dir` (as `dir/llama.cpp`): the tarball in
/// `../shared/llamacpp/`, else the PyPI source distribution that holds it.
fn unpack(workspace: &Workspace, tree: &LlamaTree, dir: &Path) -> Result<()> {
    let tarball = workspace
        .root()
        .join("../shared/llamacpp")
        .join(tree.tarball);
    if tarball.is_file() {
        return command::run(
            Command::new("tar")
                .arg("xJf")
                .arg(&tarball)
                .arg("-C")
                .arg(dir),
        );
    }
    let Some(pypi) = &tree.pypi else {
        bail!(
            "{}'s source {} is missing (it comes with the project's shared material only)",
            tree.name,
            tarball.display()
        );
    };
    let archive = dir.join("source.tar.gz");
    println!(
        "{} is not in {}: taking it from PyPI ({})",
        tree.name,
        tarball.display(),
        pypi.url
    );
    command::run(
        Command::new(python::PYTHON)
            .args(["-c", DOWNLOAD, pypi.url])
            .arg(&archive)
            .arg(pypi.sha256),
    )
    .context("cannot download llama.cpp's source from PyPI")?;
    let strip = pypi.folder.split('/').count();
    let target = dir.join("llama.cpp");
    fs::create_dir_all(&target)?;
    command::run(
        Command::new("tar")
            .arg("xzf")
            .arg(&archive)
            .arg("-C")
            .arg(&target)
            .arg(format!("--strip-components={strip}"))
            .arg(pypi.folder),
    )?;
    fs::remove_file(&archive).with_context(|| format!("cannot remove {}", archive.display()))
}

/// Downloads `argv[1]` to `argv[2]` if its sha256 is `argv[3]`.
const DOWNLOAD: &str = "import hashlib, sys, urllib.request
url, out, want = sys.argv[1:]
data = urllib.request.urlopen(url, timeout=600).read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f'{url}: sha256 {got}, expected {want}')
open(out, 'wb').write(data)
";

/// Compiler flags that keep AMX out of a `GGML_NATIVE=ON` build on x86-64
/// (explicit `-mno-…` flags win over those `-march=native` implies).
fn without_amx(tree: &LlamaTree) -> Vec<String> {
    if !cfg!(target_arch = "x86_64") || !tree.flags.contains(&"-DGGML_NATIVE=ON") {
        return Vec::new();
    }
    let flags = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16";
    vec![
        format!("-DCMAKE_C_FLAGS={flags}"),
        format!("-DCMAKE_CXX_FLAGS={flags}"),
    ]
}

/// `cmake` from the PATH, else from PyPI's `cmake` wheel installed under `dir`.
fn cmake(dir: &Path) -> Result<PathBuf> {
    if command::capture(Command::new("cmake").arg("--version")).is_ok_and(|o| o.status.success()) {
        return Ok(PathBuf::from("cmake"));
    }
    let target = dir.join("cmake-wheel");
    let binary = target.join("cmake/data/bin/cmake");
    if !binary.is_file() {
        let mut pip = python::pip(&["install", "--target"]);
        pip.arg(&target).arg("cmake");
        command::run(&mut pip).context("cmake is missing and pip could not install it")?;
    }
    Ok(binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_builds_leave_amx_out_on_x86_64() {
        let flags = without_amx(&STOCK);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(flags.len(), 2);
            assert!(flags
                .iter()
                .all(|f| f.contains("-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")));
        } else {
            assert!(flags.is_empty());
        }
        // The fork is built for AVX2 by name, never natively.
        assert!(without_amx(&FORK).is_empty());
    }
}
