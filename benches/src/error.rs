//! What can stop a benchmark, and how a benchmark binary reports it.

use std::fmt::Display;

/// A failure while preparing or running a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The environment or the benchmark asks for something this build cannot do.
    #[error("{0}")]
    Settings(String),
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// A published configuration could not be read.
    #[error(transparent)]
    Config(#[from] gemma::config::ConfigError),
    /// The model could not be loaded.
    #[error(transparent)]
    Load(#[from] gemma::load::LoadError),
    /// The forward pass failed.
    #[error(transparent)]
    Model(#[from] gemma::model::ModelError),
    /// A KV-cache operation failed.
    #[error(transparent)]
    Cache(#[from] gemma::cache::CacheError),
    /// The KLD sweep failed.
    #[error(transparent)]
    Sweep(#[from] engine::GenerateError),
}

/// The value, or (on error) the message on stderr and exit status 1: a
/// benchmark that cannot run has nothing to measure.
pub fn or_exit<T, E: Display>(result: Result<T, E>) -> T {
    match result {
        Ok(value) => value,
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            std::process::exit(1)
        }
    }
}
