//! Running mlx-lm through `tests/mlx_lm/reference.py` (its header documents
//! the request and response files).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{json, Value};

use super::workspace_root;

/// Set to `1` to skip the parity tests (they print `SKIPPED` and pass).
pub const SKIP_ENV: &str = "GEMMA_MLX_SKIP_PARITY";
/// Names the Python interpreter that has mlx-lm.
pub const PYTHON_ENV: &str = "GEMMA_MLX_PYTHON";
/// The mlx-lm release the references come from.
pub const MLX_LM_VERSION: &str = "0.32.2";
/// The MLX release under it (and under crate `gemma`).
pub const MLX_VERSION: &str = "0.32.4";

/// The interpreter to run mlx-lm with, or `None` when [`SKIP_ENV`] asks to
/// skip. Panics, saying how to get one, when it does not exist.
pub fn python() -> Option<PathBuf> {
    if std::env::var(SKIP_ENV).is_ok_and(|v| v == "1") {
        println!("SKIPPED: {SKIP_ENV}=1, mlx-lm parity not checked");
        return None;
    }
    let path = std::env::var_os(PYTHON_ENV).map_or_else(
        || workspace_root().join("target/py/venv/bin/python"),
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "the mlx-lm reference interpreter {} does not exist: run `cargo xtask setup` to create \
         the venv with mlx-lm {MLX_LM_VERSION}, or set {PYTHON_ENV} to a Python that has it \
         ({SKIP_ENV}=1 skips these tests)",
        path.display()
    );
    Some(path)
}

/// Which caches mlx-lm uses for a run.
#[derive(Debug, Clone, Copy)]
pub enum CacheSpec {
    /// The model's own `make_prompt_cache` (rotating caches for sliding layers).
    Model,
    /// A `QuantizedKVCache` in every layer.
    Quantized {
        /// Bits per value.
        bits: i32,
        /// Values per scale and bias.
        group_size: i32,
    },
}

impl CacheSpec {
    fn to_json(self) -> Value {
        match self {
            CacheSpec::Model => json!("model"),
            CacheSpec::Quantized { bits, group_size } => {
                json!({"quantized": {"bits": bits, "group_size": group_size}})
            }
        }
    }
}

/// One thing for mlx-lm to compute, on a fresh cache.
#[derive(Debug, Clone)]
pub enum Run {
    /// The logits of every position of `chunks`, fed one call per chunk.
    Logits {
        /// The caches.
        cache: CacheSpec,
        /// Token ids, one model call per chunk.
        chunks: Vec<Vec<u32>>,
    },
    /// A greedy continuation of `prompt`, `max_tokens` long.
    Greedy {
        /// The caches.
        cache: CacheSpec,
        /// The prompt, fed in one call.
        prompt: Vec<u32>,
        /// Tokens to generate.
        max_tokens: usize,
    },
}

/// What mlx-lm computed for a [`Run`].
#[derive(Debug, Clone)]
pub enum Answer {
    /// Row-major `[positions, vocab]` logits.
    Logits {
        /// The values.
        values: Vec<f32>,
        /// Logits per position.
        vocab: usize,
    },
    /// Generated token ids.
    Tokens(Vec<u32>),
}

impl Answer {
    /// The logits and vocabulary size; panics on a token answer.
    pub fn into_logits(self) -> (Vec<f32>, usize) {
        match self {
            Answer::Logits { values, vocab } => (values, vocab),
            Answer::Tokens(_) => panic!("expected logits from mlx-lm, got tokens"),
        }
    }

    /// The tokens; panics on a logits answer.
    pub fn into_tokens(self) -> Vec<u32> {
        match self {
            Answer::Tokens(t) => t,
            Answer::Logits { .. } => panic!("expected tokens from mlx-lm, got logits"),
        }
    }
}

/// mlx-lm on one model folder (a `config.json` and `model.safetensors`).
pub struct Reference {
    /// The interpreter.
    pub python: PathBuf,
    /// The model folder.
    pub model_dir: PathBuf,
}

impl Reference {
    /// Runs `runs` in one Python process (the model is loaded once); the
    /// answers come in the same order.
    pub fn run(&self, runs: &[Run]) -> Vec<Answer> {
        let work = tempfile::tempdir().expect("temporary directory");
        let logits_file = |i: usize| work.path().join(format!("logits-{i}.f32"));
        let requests: Vec<Value> = runs
            .iter()
            .enumerate()
            .map(|(i, run)| match run {
                Run::Logits { cache, chunks } => json!({
                    "kind": "logits",
                    "cache": cache.to_json(),
                    "chunks": chunks,
                    "out": logits_file(i),
                }),
                Run::Greedy {
                    cache,
                    prompt,
                    max_tokens,
                } => json!({
                    "kind": "greedy",
                    "cache": cache.to_json(),
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                }),
            })
            .collect();
        let request_path = work.path().join("request.json");
        let response_path = work.path().join("response.json");
        let request = json!({
            "model": self.model_dir,
            "response": response_path,
            "runs": requests,
        });
        std::fs::write(&request_path, request.to_string()).expect("write the request");

        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mlx_lm/reference.py");
        let started = Instant::now();
        let output = Command::new(&self.python)
            .arg(&script)
            .arg(&request_path)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.python.display()));
        assert!(
            output.status.success(),
            "{} {} failed ({}):\n{}",
            self.python.display(),
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        println!("mlx-lm took {:.1} s", started.elapsed().as_secs_f64());

        let text = std::fs::read_to_string(&response_path)
            .unwrap_or_else(|e| panic!("{}: {e}", response_path.display()));
        let response: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", response_path.display()));
        assert_eq!(
            (response["mlx_lm"].as_str(), response["mlx"].as_str()),
            (Some(MLX_LM_VERSION), Some(MLX_VERSION)),
            "the reference interpreter {} has the wrong mlx-lm / mlx versions",
            self.python.display()
        );
        let answers = response["runs"].as_array().expect("runs in the response");
        assert_eq!(answers.len(), runs.len());
        runs.iter()
            .zip(answers)
            .enumerate()
            .map(|(i, (run, answer))| match run {
                Run::Logits { .. } => {
                    let vocab = answer["vocab"].as_u64().expect("vocab") as usize;
                    let positions = answer["positions"].as_u64().expect("positions") as usize;
                    let values = read_f32(&logits_file(i));
                    assert_eq!(
                        values.len(),
                        positions * vocab,
                        "size of {}",
                        logits_file(i).display()
                    );
                    Answer::Logits { values, vocab }
                }
                Run::Greedy { .. } => Answer::Tokens(
                    answer["tokens"]
                        .as_array()
                        .expect("tokens")
                        .iter()
                        .map(|t| t.as_u64().expect("token id") as u32)
                        .collect(),
                ),
            })
            .collect()
    }
}

/// A file of little-endian f32 values.
fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.len().is_multiple_of(4),
        "{}: not whole f32 values",
        path.display()
    );
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
