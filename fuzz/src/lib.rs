//! Helpers shared by the fuzz targets under `fuzz_targets/`: what every
//! configuration must satisfy ([`config`]), a scratch
//! folder for readers that only take paths ([`scratch`]), the default
//! model's tokenizer built once per process ([`model`]), and a cursor that
//! splits one fuzz input into fields ([`input`]).
//!
//! Every target asserts what must hold for its reader and must never panic
//! on any input; a panic, an abort, a timeout or an allocation over
//! libFuzzer's `-malloc_limit_mb` is a finding (see `docs/fuzzing.md`).

pub mod config;
pub mod input;
pub mod model;
pub mod scratch;
