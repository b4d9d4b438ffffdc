//! Support for the criterion benchmarks in `benches/benches/`: which device,
//! dtype and model shape to measure ([`settings`]), the weights and inputs
//! ([`inputs`]), and a decode step that keeps its context length fixed from
//! one iteration to the next ([`decode`]).
//!
//! `cargo bench -p benches` measures on the CPU in float32 with the 270M
//! shape (the default GGUF model when it is present, random weights
//! otherwise); `BENCH_DEVICE=gpu` measures on the GPU in bfloat16 with random
//! weights of the 1B shape.

pub mod decode;
pub mod error;
pub mod inputs;
pub mod settings;

pub use error::{or_exit, BenchError};
pub use settings::Settings;
