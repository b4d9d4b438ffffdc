//! Gives this crate's tests, examples and benches a RUNPATH entry to the folder holding `libmlx.so`.

fn main() {
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{dir}");
    }
}
