//! `cargo xtask`: the workspace's tasks.
//!
//! - `setup` provisions MLX 0.32.4 (with OpenBLAS behind its CPU backend),
//!   the default model and the mlx-lm reference Python environment under
//!   `target/`;
//! - `bindgen` regenerates `crates/mlx-sys/src/bindings.rs` from
//!   `mlx-c/include/mlx_c.h`, or checks that it is up to date;
//! - `test` sets up, then runs every check and test, then the examples;
//! - `run` sets up, then runs the `gemma-mlx` command;
//! - `bench` compares `gemma-mlx` with mlx-lm and writes `target/bench/report.md`;
//! - `compare-kld` puts our KLD of every KV spec beside the TurboQuant
//!   fork's `llama-perplexity` and writes `target/compare-kld/report.md`;
//! - `fuzz` builds the cargo-fuzz targets of `fuzz/` and runs them (docs/fuzzing.md);
//! - `sanitize` runs `mlx-core`'s tests and short `gemma-mlx` runs under
//!   AddressSanitizer and LeakSanitizer (docs/fuzzing.md, "Sanitizers").
//!
//! This crate depends on no MLX crate, so it builds before MLX is found.

mod bench;
mod bindings;
mod blas;
mod command;
mod compare_kld;
mod discovery;
mod examples;
mod fuzz;
mod ldd;
mod llama_build;
mod llama_perplexity;
mod mlx_build;
mod mlx_lm_env;
mod model;
mod provision;
mod python;
mod record;
mod refract_env;
mod run_engine;
mod sanitize;
mod setup;
mod system;
mod test_all;
mod workspace;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::mlx_build::Backend;
use crate::setup::SetupOptions;
use crate::workspace::Workspace;

/// Workspace tasks for gemma-mlx.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", about)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Provision MLX 0.32.4, an optimized BLAS, the default model and the mlx-lm
    /// reference Python environment under target/.
    Setup {
        /// Which MLX build to provision.
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// Unpack MLX, assemble the model and create the reference Python
        /// environment again even if they are present.
        #[arg(long)]
        force: bool,
        /// Skip the default model.
        #[arg(long)]
        no_model: bool,
        /// Skip the mlx-lm reference Python environment (target/py/venv).
        #[arg(long)]
        no_reference: bool,
        /// Never download MLX: use MLX_DIR, an earlier setup, or a Python mlx install.
        #[arg(long)]
        no_provision: bool,
    },
    /// Generate crates/mlx-sys/src/bindings.rs from mlx-c/include/mlx_c.h.
    Bindgen {
        /// Fail if the committed bindings differ from freshly generated ones.
        #[arg(long)]
        check: bool,
    },
    /// Set up, then check bindings, formatting and lints, run every test, then every example.
    Test {
        /// Which MLX build to test against.
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// Extra arguments for `cargo test` (after `--`).
        #[arg(last = true)]
        cargo_test_args: Vec<String>,
    },
    /// Set up, then run `gemma-mlx` (by default a short generation).
    Run {
        /// Which MLX build to run on.
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// Arguments for `gemma-mlx` (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Set up, then compare gemma-mlx with mlx-lm 0.32.2 (target/bench/report.md).
    Bench {
        /// Alternating rounds of the same-settings comparison.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Rounds of the as-shipped comparison (0 skips it; it is slow).
        #[arg(long, default_value_t = 1)]
        shipped_rounds: usize,
        /// Also measure memory flatness over 4,000 decoded tokens (minutes).
        #[arg(long)]
        flatness: bool,
        /// Chunks of the KLD sweep timing, and of the sweep beside
        /// llama-perplexity in the llama.cpp rounds (0 skips both).
        #[arg(long, default_value_t = 2)]
        kld_chunks: usize,
        /// Rounds of the comparison with llama.cpp on the same GGUF file (0
        /// skips it; the first run builds llama.cpp under target/llamacpp,
        /// about 9 minutes on 2 cores).
        #[arg(long, default_value_t = 2)]
        llama_rounds: usize,
    },
    /// Set up, build the TurboQuant fork of llama.cpp (once, under target/llama-fork, about 8
    /// minutes on 2 cores) and put gemma-mlx's mean KLD of each KV spec beside its
    /// llama-perplexity's on the same GGUF, corpus and chunks (target/compare-kld/report.md).
    CompareKld {
        /// Chunks of 512 tokens (the shipped corpus holds 8).
        #[arg(long, default_value_t = 6)]
        chunks: usize,
        /// A KEYS/VALUES pair such as q8_0/turbo4 (repeatable; default: every llama.cpp
        /// block type, every turbo width, and mixed pairs).
        #[arg(long = "spec")]
        specs: Vec<String>,
        /// Run both engines on an F32 copy of the model (made with the fork's llama-quantize),
        /// so that no weight product quantizes its activations.
        #[arg(long)]
        f32_weights: bool,
    },
    /// Set up, build the fuzz targets of fuzz/ (nightly, cargo-fuzz) and run one or all of
    /// them, replaying fuzz/regressions/ first; a crashing input is kept there.
    Fuzz {
        /// The target to run (default: all of them).
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(fuzz::TARGETS))]
        target: Option<String>,
        /// Seconds of fuzzing per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// The sanitizer to build with.
        #[arg(long, value_enum, default_value_t = fuzz::Sanitizer::Address)]
        sanitizer: fuzz::Sanitizer,
        /// Start from the committed seeds alone, forgetting what earlier runs found.
        #[arg(long)]
        fresh: bool,
        /// Which MLX build the targets link.
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// Targets fuzzed at once (each uses one core).
        #[arg(long, default_value_t = 1)]
        jobs: usize,
    },
    /// Set up, build mlx-core's tests and gemma-mlx with AddressSanitizer (nightly; mlx-c's
    /// C++ too) and run them, a short generation and a 2-chunk KLD run; fails on any
    /// invalid access or leak of ours.
    Sanitize {
        /// The CI subset: the canaries, mlx-core's tests, one generation and the KLD run.
        #[arg(long)]
        quick: bool,
        /// Which MLX build to link.
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(task: Task) -> anyhow::Result<()> {
    let workspace = Workspace::locate()?;
    match task {
        Task::Setup {
            backend,
            force,
            no_model,
            no_reference,
            no_provision,
        } => {
            let options = SetupOptions {
                backend,
                force,
                model: !no_model,
                reference: !no_reference,
                provision: !no_provision,
            };
            setup::run(&workspace, &options)
        }
        Task::Bindgen { check } => bindings::run(&workspace, check),
        Task::Test {
            backend,
            cargo_test_args,
        } => test_all::run(&workspace, backend, &cargo_test_args),
        Task::Run { backend, args } => run_engine::run(&workspace, backend, &args),
        Task::Bench {
            rounds,
            shipped_rounds,
            flatness,
            kld_chunks,
            llama_rounds,
        } => bench::run(
            &workspace,
            &bench::BenchOptions {
                rounds,
                shipped_rounds,
                flatness,
                kld_chunks,
                llama_rounds,
            },
        ),
        Task::CompareKld {
            chunks,
            specs,
            f32_weights,
        } => compare_kld::run(
            &workspace,
            &compare_kld::CompareOptions {
                chunks,
                specs,
                f32_weights,
            },
        ),
        Task::Fuzz {
            target,
            seconds,
            sanitizer,
            fresh,
            backend,
            jobs,
        } => fuzz::run(
            &workspace,
            &fuzz::FuzzOptions {
                target,
                seconds,
                sanitizer,
                fresh,
                backend,
                jobs,
            },
        ),
        Task::Sanitize { quick, backend } => {
            sanitize::run(&workspace, &sanitize::SanitizeOptions { quick, backend })
        }
    }
}
