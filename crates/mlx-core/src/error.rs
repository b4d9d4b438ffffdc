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
