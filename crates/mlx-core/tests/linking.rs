//! The test executables find libmlx.so through a RUNPATH entry (not RPATH,
//! so LD_LIBRARY_PATH can still point at another MLX build).

use std::path::Path;
use std::process::Command;

/// The lines of `readelf -d` for this test executable.
fn dynamic_section() -> String {
    let exe = std::env::current_exe().unwrap();
    let output = Command::new("readelf")
        .arg("-d")
        .arg(&exe)
        .output()
        .expect("readelf (binutils) runs");
    assert!(
        output.status.success(),
        "readelf -d {} failed",
        exe.display()
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_test_executable_has_a_runpath_to_libmlx_and_no_rpath() {
    let dynamic = dynamic_section();
    assert!(!dynamic.contains("(RPATH)"), "an RPATH entry:\n{dynamic}");
    let runpath = dynamic
        .lines()
        .find(|line| line.contains("(RUNPATH)"))
        .unwrap_or_else(|| panic!("no RUNPATH entry:\n{dynamic}"));
    // "... (RUNPATH)  Library runpath: [/a:/b]"
    let list = runpath
        .split_once('[')
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(inside, _)| inside)
        .unwrap_or_else(|| panic!("unexpected readelf line: {runpath}"));
    assert!(
        list.split(':')
            .any(|dir| Path::new(dir).join("libmlx.so").is_file()),
        "no RUNPATH folder holds libmlx.so: [{list}]"
    );
}

#[test]
fn the_test_executable_needs_libmlx() {
    // Calling into MLX keeps the linker (with --as-needed) from dropping it.
    assert_eq!(mlx_core::device::mlx_version(), "0.32.4");
    let dynamic = dynamic_section();
    assert!(
        dynamic
            .lines()
            .any(|line| line.contains("(NEEDED)") && line.contains("[libmlx.so")),
        "libmlx.so is not a NEEDED library:\n{dynamic}"
    );
}
