//! MLX's own memory counters and limits.

use mlx_sys as sys;

use crate::error::{check, Result};

fn read(f: unsafe extern "C" fn(*mut usize) -> i32) -> Result<usize> {
    let mut out = 0usize;
    // SAFETY: `f` writes one size_t through a valid pointer.
    check(unsafe { f(&mut out) })?;
    Ok(out)
}

/// Bytes held by live arrays.
pub fn active_bytes() -> Result<usize> {
    read(sys::mlx_memory_active)
}

/// The most bytes held at once since start or the last [`reset_peak`].
pub fn peak_bytes() -> Result<usize> {
    read(sys::mlx_memory_peak)
}

/// Bytes kept in MLX's buffer cache for reuse.
pub fn cache_bytes() -> Result<usize> {
    read(sys::mlx_memory_cache)
}

/// The memory limit in bytes.
pub fn memory_limit() -> Result<usize> {
    read(sys::mlx_memory_limit)
}

/// Restarts peak tracking from the current use.
pub fn reset_peak() -> Result<()> {
    // SAFETY: no arguments.
    check(unsafe { sys::mlx_memory_reset_peak() })
}

/// Sets the memory limit; returns the previous one.
pub fn set_memory_limit(bytes: usize) -> Result<usize> {
    let mut previous = 0usize;
    // SAFETY: writes one size_t through a valid pointer.
    check(unsafe { sys::mlx_memory_set_limit(&mut previous, bytes) })?;
    Ok(previous)
}

/// Sets the buffer cache limit (0 disables the cache); returns the previous one.
pub fn set_cache_limit(bytes: usize) -> Result<usize> {
    let mut previous = 0usize;
    // SAFETY: writes one size_t through a valid pointer.
    check(unsafe { sys::mlx_memory_set_cache_limit(&mut previous, bytes) })?;
    Ok(previous)
}

/// Returns the cached buffers to the system.
pub fn clear_cache() -> Result<()> {
    // SAFETY: no arguments.
    check(unsafe { sys::mlx_memory_clear_cache() })
}

/// MLX's buffer-cache limit raised to at least a number of bytes while this
/// lives; dropping it sets the previous limit back, which returns what the
/// cache holds past it to the system.
#[derive(Debug)]
pub struct CacheLimitRaised {
    previous: usize,
}

impl CacheLimitRaised {
    /// Raises the limit to `bytes` where it is lower (a higher limit stays).
    pub fn at_least(bytes: usize) -> Result<CacheLimitRaised> {
        let previous = set_cache_limit(bytes)?;
        if previous > bytes {
            set_cache_limit(previous)?;
        }
        Ok(CacheLimitRaised { previous })
    }
}

impl Drop for CacheLimitRaised {
    fn drop(&mut self) {
        // Setting a limit fails only where MLX is unusable, and a drop
        // cannot report it: the larger limit then stays.
        let _ = set_cache_limit(self.previous);
    }
}
