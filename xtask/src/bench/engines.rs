//! Running one engine over a plan: our `gemma-mlx bench`, or mlx-lm through
//! `xtask/bench/mlx_lm_bench.py`; both print the same JSON.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::command;

/// The figures of one case.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaseResult {
    /// The case's name.
    pub name: String,
    /// The generated token ids.
    pub token_ids: Vec<u32>,
    /// Prompt tokens per second (prompt tokens / time to first token).
    pub prompt_tps: f64,
    /// Generated tokens per second after the first.
    pub generation_tps: f64,
    /// Seconds from the call to the first token.
    pub ttft_s: f64,
    /// MLX's peak memory during the case.
    pub peak_memory_bytes: u64,
}

/// One engine's output for a plan.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunOutput {
    /// The engine and its version.
    pub engine: String,
    /// The MLX version it ran on.
    pub mlx_version: String,
    /// mlx-lm only: what its own `kv_bits=` does on this model.
    #[serde(default)]
    pub kv_bits_error: Option<String>,
    /// One result per case, in plan order.
    pub results: Vec<CaseResult>,
    /// Ours only: the memory-flatness points, when asked for.
    #[serde(default)]
    pub flatness: Option<serde_json::Value>,
}

impl RunOutput {
    /// The result of the case named `name`.
    pub fn case(&self, name: &str) -> Option<&CaseResult> {
        self.results.iter().find(|r| r.name == name)
    }
}

/// An engine the bench can run.
#[derive(Clone, Debug)]
pub enum Engine {
    /// `gemma-mlx bench` with these model arguments.
    Ours {
        /// The binary.
        binary: PathBuf,
        /// Arguments choosing the model, dtype and so on.
        model_args: Vec<String>,
    },
    /// mlx-lm in this Python on this converted model folder.
    MlxLm {
        /// The venv's python.
        python: PathBuf,
        /// The script.
        script: PathBuf,
        /// The Hugging Face-style folder.
        model_dir: PathBuf,
    },
}

impl Engine {
    /// Runs the plan at `plan` (plus `extra` arguments for ours) and parses
    /// the JSON the engine prints last.
    pub fn run(&self, plan: &Path, extra: &[String]) -> Result<RunOutput> {
        let mut run = match self {
            Engine::Ours { binary, model_args } => {
                let mut run = Command::new(binary);
                run.arg("bench")
                    .arg("--plan")
                    .arg(plan)
                    .args(model_args)
                    .args(extra);
                run
            }
            Engine::MlxLm {
                python,
                script,
                model_dir,
            } => {
                let mut run = Command::new(python);
                run.arg(script).arg(plan).arg(model_dir);
                run
            }
        };
        let stdout = command::stdout_of(&mut run)?;
        let last = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last).with_context(|| {
            format!(
                "`{}` did not print the benchmark JSON last: {last}",
                command::describe(&run)
            )
        })
    }
}
