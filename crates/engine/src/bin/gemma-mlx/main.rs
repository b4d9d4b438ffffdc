//! `gemma-mlx`: generate, chat, tokenize, inspect and convert Gemma 3 models on MLX, score
//! KV-cache formats, and serve all of that to other tools as a worker.

mod args;
mod bench;
mod commands;
mod eval;
mod model_args;
mod output;
mod sampling_args;
mod worker;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
