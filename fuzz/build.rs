//! Gives the fuzz targets a RUNPATH entry to the folder holding `libmlx.so`,
//! as the workspace crates' build scripts do for their tests.

fn main() {
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{dir}");
    }
}
