//! The error type of every fallible operation.

use std::ffi::CStr;

/// What went wrong in an MLX operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// MLX raised an exception; the text is MLX's own message.
    #[error("MLX: {0}")]
    Mlx(String),
    /// Host data given to or asked of an array does not fit it.
    #[error("{0}")]
    Host(String),
}

/// Result of an MLX operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turns a C status into a `Result`, fetching this thread's message on failure.
pub(crate) fn check(status: std::os::raw::c_int) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: mlx_last_error returns a NUL-terminated thread-local string that
    // stays valid until the next failing call on this thread; it is copied here.
    let message = unsafe { CStr::from_ptr(mlx_sys::mlx_last_error()) }
        .to_string_lossy()
        .into_owned();
    Err(Error::Mlx(message))
}

/// The C status of a Rust callback MLX made: 0 for `Ok`, else 1 with the
/// message copied (cut to fit, NUL-terminated) into the caller's buffer
/// `error` of `error_len` bytes (nothing written when it is null or empty).
/// A panic gives `panicked` as its message.
pub(crate) fn callback_status<E: std::fmt::Display>(
    result: std::thread::Result<std::result::Result<(), E>>,
    panicked: &str,
    error: *mut std::os::raw::c_char,
    error_len: usize,
) -> i32 {
    let message = match result {
        Ok(Ok(())) => return 0,
        Ok(Err(e)) => e.to_string(),
        Err(_) => panicked.to_string(),
    };
    if !error.is_null() && error_len > 0 {
        let bytes = message.as_bytes();
        let len = bytes.len().min(error_len - 1);
        // SAFETY: the caller gives `error` room for `error_len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), error.cast::<u8>(), len);
            *error.add(len) = 0;
        }
    }
    1
}
