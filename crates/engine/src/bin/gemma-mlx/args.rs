//! Command-line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::model_args::ModelArgs;
use engine::options::DecodeMode;

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

/// Sampling and generation settings, named as mlx-lm names them.
#[derive(Debug, Args, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temp: f32,
    /// Keep only the k most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p.
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than min-p times the most likely one.
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Penalty for tokens in the recent window (> 1 discourages repeats).
    #[arg(long, allow_negative_numbers = true)]
    pub repetition_penalty: Option<f32>,
    /// How many recent tokens the repetition penalty looks at.
    #[arg(long, default_value_t = 20)]
    pub repetition_context_size: usize,
    /// Subtracted from the logit of every token in the recent window.
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// How many recent tokens the presence penalty looks at.
    #[arg(long, default_value_t = 20)]
    pub presence_context_size: usize,
    /// Subtracted once per occurrence in the recent window.
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// How many recent tokens the frequency penalty looks at.
    #[arg(long, default_value_t = 20)]
    pub frequency_context_size: usize,
    /// XTC: the probability, per token, of removing every token more likely
    /// than `--xtc-threshold` except the least likely of them (never the
    /// newline and end-of-sequence tokens).
    #[arg(long)]
    pub xtc_probability: Option<f32>,
    /// XTC's probability threshold, in [0, 0.5].
    #[arg(long, default_value_t = 0.1)]
    pub xtc_threshold: f32,
    /// Added to a token's logit: ID=BIAS, repeatable.
    #[arg(long = "logit-bias", value_parser = parse_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// KV-cache format, e.g. `ctk=q8_0,ctv=q4_0,group=64`.
    #[arg(long)]
    pub kv: Option<String>,
    /// Prompt tokens per forward pass (default: 256 on cpu, 2048 on gpu).
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// How tokens after the prompt are decoded: `compiled` runs one
    /// fixed-shape step compiled by MLX (every KV cache format; eager where a
    /// cache changes format during the generation). Default: compiled where
    /// the step runs every block as one kernel of ours (on the GPU with our
    /// kernels; on the CPU with `--weights native` and every projection on
    /// our kernels), eager otherwise.
    #[arg(long, value_enum)]
    pub decode: Option<DecodeMode>,
    /// Decode steps queued on the device per host-device synchronisation
    /// (default: 1 on cpu, 16 on gpu); tokens then arrive in bursts.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub steps_per_sync: Option<u64>,
}

fn parse_bias(text: &str) -> Result<(u32, f32), String> {
    let (id, bias) = text
        .split_once('=')
        .ok_or_else(|| format!("'{text}' is not ID=BIAS"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("'{id}' is not a token id"))?;
    let bias = bias
        .trim()
        .parse()
        .map_err(|_| format!("'{bias}' is not a number"))?;
    Ok((id, bias))
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
