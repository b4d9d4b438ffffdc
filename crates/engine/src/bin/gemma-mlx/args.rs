//! Command-line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::model_args::ModelArgs;
use crate::sampling_args::SamplingArgs;

/// Gemma 3 inference and KV-cache evaluation on MLX.
#[derive(Debug, Parser)]
#[command(name = "gemma-mlx", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Complete a prompt (argument or stdin), streaming the text to stdout.
    Generate(GenerateArgs),
    /// Talk with the model, turn by turn, reusing the KV cache across turns.
    Chat(ChatArgs),
    /// Print the token ids of a text.
    Tokenize(TokenizeArgs),
    /// Print details of the model and of MLX.
    Info(InfoArgs),
    /// Write the model as a Hugging Face-style folder that mlx-lm can load.
    Convert(ConvertArgs),
    /// Score KV-cache formats by KL divergence against a reference format.
    Kld(crate::eval::KldArgs),
    /// Score KV-cache formats by greedy-trajectory agreement.
    Trajectory(crate::eval::TrajectoryArgs),
    /// Time the cases of a benchmark plan (for `cargo xtask bench`).
    #[command(hide = true)]
    Bench(crate::bench::BenchArgs),
    /// Serve requests as JSON lines on stdin with the model loaded once
    /// (complete, kld, trajectory, tokenize, info, load).
    Worker(crate::worker::WorkerArgs),
}

/// `generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The prompt (raw text; `<bos>` is prepended). Read from stdin when absent.
    #[arg(conflicts_with_all = ["token_ids", "synthetic_prompt"])]
    pub prompt: Option<String>,
    /// The prompt as token ids, comma-separated (for models without a tokenizer).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["chat", "synthetic_prompt"])]
    pub token_ids: Vec<u32>,
    /// A synthetic prompt of N token ids (`<bos>` then a fixed pseudo-random
    /// sequence), for speed measurements, with random weights too.
    #[arg(long, value_name = "N", conflicts_with = "chat")]
    pub synthetic_prompt: Option<usize>,
    /// Wrap the prompt as a user turn with the chat template.
    #[arg(long)]
    pub chat: bool,
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sampling.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Print one JSON object on stdout's last line (streamed text goes to stderr).
    #[arg(long)]
    pub json: bool,
}

/// `chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    /// A system message.
    #[arg(long)]
    pub system: Option<String>,
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sampling.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Print one JSON object per turn on stdout (text streams to stderr).
    #[arg(long)]
    pub json: bool,
}

/// `tokenize`.
#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// The text (read from stdin when absent).
    pub text: Option<String>,
    /// Tokenize as plain text: no `<bos>`, special-token text kept as text.
    #[arg(long)]
    pub plain: bool,
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The folder to write.
    #[arg(long)]
    pub out: PathBuf,
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}
