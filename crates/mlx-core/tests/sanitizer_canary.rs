//! Canaries for `cargo xtask sanitize` (docs/fuzzing.md, "Sanitizers"): each
//! test makes one memory error on purpose, so that a run under
//! AddressSanitizer proves it sees errors of that kind in our code before its
//! silence on the real tests is believed. They are ignored: a plain
//! `cargo test` never runs them, and without a sanitizer they are undefined
//! behaviour that may pass unnoticed. The task runs each alone and expects
//! its report.

use mlx_core::Array;
use mlx_sys as sys;

/// A leaked `Array`: its handle (allocated by `mlx-c`) and MLX's array behind
/// it are never freed. LeakSanitizer must report a direct leak through
/// `mlx_array_from_data`.
#[test]
#[ignore = "a planted leak, run by cargo xtask sanitize"]
fn canary_leaked_array() {
    let array = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    std::mem::forget(array);
}

/// A handle read after `mlx_array_free`: the read happens inside `mlx-c`'s
/// C++ (`mlx_array_ndim`), so AddressSanitizer reports a
/// heap-use-after-free only if `mlx-c` was compiled with `-fsanitize=address`.
#[test]
#[ignore = "a planted use after free, run by cargo xtask sanitize"]
fn canary_handle_used_after_free() {
    let data = [1.0f32, 2.0];
    let shape = [2i32];
    let mut handle: sys::mlx_array = std::ptr::null_mut();
    let mut ndim = 0usize;
    // SAFETY: none; the second call reads freed memory on purpose.
    unsafe {
        let status = sys::mlx_array_from_data(
            &mut handle,
            data.as_ptr().cast(),
            shape.as_ptr(),
            shape.len(),
            sys::MLX_FLOAT32,
        );
        assert_eq!(status, 0);
        sys::mlx_array_free(handle);
        sys::mlx_array_ndim(&mut ndim, handle);
    }
    assert_eq!(ndim, 1);
}
