//! Finds MLX, compiles `mlx-c/` against its headers and links `libmlx.so`.
//!
//! MLX is looked for, in order: the `MLX_DIR` environment variable (a folder
//! with `include/` and `lib/libmlx.so`), the record `cargo xtask setup` writes
//! (`target/mlx/provisioned.json`, key `mlx_dir`), then a Python `mlx`
//! install. The folder holding `libmlx.so` is written into every binary as a
//! RUNPATH entry (not RPATH, so `LD_LIBRARY_PATH` can still swap in another
//! build, such as the CUDA one) and handed to dependent build scripts as
//! `DEP_MLX_LIB_DIR`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest_dir
        .parent()
        .and_then(Path::parent)
        .expect("crates/mlx-sys sits two levels below the workspace root")
        .to_path_buf();
    let record = workspace.join("target/mlx/provisioned.json");
    let c_api = workspace.join("mlx-c");

    println!("cargo:rerun-if-env-changed=MLX_DIR");
    // A missing file watched would rerun this script (and rebuild every
    // crate above) on every build; with MLX_DIR set the record is not read.
    if record.exists() || env::var_os("MLX_DIR").is_none() {
        println!("cargo:rerun-if-changed={}", record.display());
    }
    println!("cargo:rerun-if-changed={}", c_api.display());

    let mlx_dir = match find_mlx(&record) {
        Ok(dir) => dir,
        Err(why) => {
            eprintln!(
                "error: MLX not found ({why}).\n\
                 Run `cargo xtask setup` to provision MLX 0.32.4 under target/, \
                 or set MLX_DIR to a folder with include/ and lib/libmlx.so."
            );
            std::process::exit(1);
        }
    };
    let include = mlx_dir.join("include");
    let lib = mlx_dir.join("lib");

    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .include(c_api.join("include"))
        .include(&include)
        .file(c_api.join("src/core.cpp"))
        .file(c_api.join("src/ops.cpp"))
        .file(c_api.join("src/linear.cpp"))
        .file(c_api.join("src/kernels.cpp"))
        .file(c_api.join("src/cpu_kernel.cpp"))
        .file(c_api.join("src/block_dot.cpp"))
        .file(c_api.join("src/distributed.cpp"))
        .flag_if_supported("-Wno-unused-parameter")
        .compile("mlx_c");

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    println!("cargo:rustc-link-lib=dylib=dl");
    println!(
        "cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{}",
        lib.display()
    );
    println!("cargo:lib_dir={}", lib.display());
    println!("cargo:include_dir={}", include.display());
}

/// The MLX folder to build against, or why none was found.
fn find_mlx(record: &Path) -> Result<PathBuf, String> {
    if let Some(dir) = env::var_os("MLX_DIR") {
        let dir = PathBuf::from(dir);
        return check(&dir)
            .map(|()| dir)
            .map_err(|e| format!("MLX_DIR: {e}"));
    }
    if let Ok(text) = std::fs::read_to_string(record) {
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", record.display()))?;
        let dir = json
            .get("mlx_dir")
            .and_then(|v| v.as_str())
            .map(PathBuf::from)
            .ok_or_else(|| format!("{}: no \"mlx_dir\" string", record.display()))?;
        return check(&dir)
            .map(|()| dir)
            .map_err(|e| format!("{}: {e}", record.display()));
    }
    let output = Command::new("python3")
        .args(["-c", "import mlx; print(list(mlx.__path__)[0])"])
        .output()
        .map_err(|e| format!("no {} and python3 failed to start: {e}", record.display()))?;
    if !output.status.success() {
        return Err(format!(
            "no MLX_DIR, no {}, and no Python mlx install",
            record.display()
        ));
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    check(&dir)
        .map(|()| dir)
        .map_err(|e| format!("Python mlx install: {e}"))
}

/// Checks that `dir` holds MLX's headers and shared library.
fn check(dir: &Path) -> Result<(), String> {
    for needed in ["include/mlx/mlx.h", "lib/libmlx.so"] {
        if !dir.join(needed).is_file() {
            return Err(format!("{} has no {needed}", dir.display()));
        }
    }
    Ok(())
}
