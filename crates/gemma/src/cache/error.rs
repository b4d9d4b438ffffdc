//! The error of cache bookkeeping.

/// Errors of cache bookkeeping.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// A format or argument the cache cannot take.
    #[error("KV cache: {0}")]
    Format(String),
}
