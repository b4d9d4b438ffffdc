//! `worker`: the model loaded once, then requests as JSON lines on stdin,
//! each answered with one JSON line on stdout, for tools that call the
//! engine many times (REFRACT's backend).
//!
//! A request is an object with an `op` and, optionally, an `id` that the
//! answer repeats:
//! - `{"op": "complete", "prompt": "...", "chat": false, "system": null,
//!   "flags": {"max-tokens": 32, "kv": "ctk=q8_0,ctv=turbo4", "temp": 0}}`:
//!   `generate`'s `--json` fields; `flags` are `generate`'s sampling flags
//!   by their command-line names (an array repeats a flag, `true` gives a
//!   bare one); `chat` wraps the prompt as a user turn after `system`;
//! - `{"op": "kld", "corpus": "...", "ref": "", "cand": ["..."], "ctx": 512,
//!   "chunks": 32, "bos": true, "second_half": false, "two_forwards": false,
//!   "prompts": null, "max_tokens": 128}`: `kld --json`'s report;
//! - `{"op": "trajectory", "prompts": "...", "ref": "", "cand": ["..."],
//!   "max_tokens": 128}`: `trajectory --json`'s report;
//! - `{"op": "tokenize", "text": "...", "plain": false}`: `tokenize --json`'s;
//! - `{"op": "info"}`: `info --json`'s;
//! - `{"op": "load", "model": "PATH"}`: loads that model in place of the
//!   current one (its `info`).
//!
//! Answers: `{"id": ..., "ok": true, "result": {...}}`, or `{"id": ...,
//! "ok": false, "error": "what is wrong"}` for a malformed line, an unknown
//! op, bad flags, a failed request, or a model that failed to load; the
//! worker then goes on serving. It ends when stdin closes.

use std::io::{BufRead, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser};
use engine::Engine;
use gemma::chat_template::{ChatMessage, Role};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::eval::{kld_report, parse_specs, trajectory_report, KldJob};
use crate::model_args::ModelArgs;
use crate::output::{generation_json, tokenize_json};
use crate::sampling_args::SamplingArgs;
use crate::sampling_args::{fit_to_model, options};

/// `worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The model loaded at the start (requests may load another).
    #[command(flatten)]
    pub model: ModelArgs,
}

/// One request line.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Request {
    Complete {
        prompt: String,
        #[serde(default)]
        chat: bool,
        #[serde(default)]
        system: Option<String>,
        #[serde(default)]
        flags: serde_json::Map<String, Value>,
    },
    Kld {
        corpus: PathBuf,
        #[serde(default, rename = "ref")]
        reference: String,
        cand: Vec<String>,
        #[serde(default = "default_ctx")]
        ctx: usize,
        #[serde(default = "default_chunks")]
        chunks: usize,
        #[serde(default = "default_bos")]
        bos: bool,
        #[serde(default)]
        second_half: bool,
        #[serde(default)]
        two_forwards: bool,
        #[serde(default)]
        prompts: Option<PathBuf>,
        #[serde(default = "default_trajectory_tokens")]
        max_tokens: usize,
    },
    Trajectory {
        prompts: PathBuf,
        #[serde(default, rename = "ref")]
        reference: String,
        cand: Vec<String>,
        #[serde(default = "default_trajectory_tokens")]
        max_tokens: usize,
    },
    Tokenize {
        text: String,
        #[serde(default)]
        plain: bool,
    },
    Info {},
    Load {
        model: PathBuf,
    },
}

fn default_ctx() -> usize {
    512
}

fn default_chunks() -> usize {
    32
}

fn default_bos() -> bool {
    true
}

fn default_trajectory_tokens() -> usize {
    128
}

/// `generate`'s sampling flags, parsed from an argument list.
#[derive(Debug, Parser)]
#[command(name = "flags", no_binary_name = true)]
struct Flags {
    #[command(flatten)]
    sampling: SamplingArgs,
}

/// The loaded model, or why there is none.
struct Worker {
    args: ModelArgs,
    engine: Result<Engine, String>,
}

/// Runs `worker` until stdin closes.
pub fn worker(args: WorkerArgs) -> Result<()> {
    let engine = args.model.load(true).map_err(|e| format!("{e:#}"));
    let mut worker = Worker {
        args: args.model,
        engine,
    };
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = worker.answer(&line);
        writeln!(stdout, "{answer}").context("writing stdout")?;
        stdout.flush().context("writing stdout")?;
    }
    Ok(())
}

impl Worker {
    /// The answer line to one request line.
    fn answer(&mut self, line: &str) -> Value {
        let parsed: Result<Value, _> = serde_json::from_str(line);
        let id = parsed
            .as_ref()
            .ok()
            .and_then(|v| v.get("id").cloned())
            .unwrap_or(Value::Null);
        let outcome = match parsed {
            Err(e) => Err(anyhow!("the request is not JSON: {e}")),
            Ok(mut value) => {
                if let Some(fields) = value.as_object_mut() {
                    fields.remove("id");
                }
                catch_unwind(AssertUnwindSafe(|| self.serve(value))).unwrap_or_else(|_| {
                    Err(anyhow!("the request panicked (a bug: please report it)"))
                })
            }
        };
        match outcome {
            Ok(result) => json!({"id": id, "ok": true, "result": result}),
            Err(e) => json!({"id": id, "ok": false, "error": format!("{e:#}")}),
        }
    }

    fn engine(&self) -> Result<&Engine> {
        self.engine
            .as_ref()
            .map_err(|e| anyhow!("no model is loaded: {e}"))
    }

    fn serve(&mut self, value: Value) -> Result<Value> {
        let request: Request = serde_json::from_value(value).context("malformed request")?;
        match request {
            Request::Complete {
                prompt,
                chat,
                system,
                flags,
            } => self.complete(&prompt, chat, system, &flags),
            Request::Kld {
                corpus,
                reference,
                cand,
                ctx,
                chunks,
                bos,
                second_half,
                two_forwards,
                prompts,
                max_tokens,
            } => {
                let (reference, candidates) = parse_specs(&reference, &cand)?;
                if candidates.is_empty() {
                    bail!("no candidates: give \"cand\": [SPEC, ...]");
                }
                let job = KldJob {
                    corpus: &corpus,
                    reference,
                    candidates,
                    ctx,
                    chunks,
                    bos,
                    second_half,
                    two_forwards,
                    prompts: prompts.as_deref(),
                    max_tokens,
                    quiet: true,
                };
                Ok(serde_json::to_value(kld_report(
                    self.engine()?,
                    None,
                    &job,
                )?)?)
            }
            Request::Trajectory {
                prompts,
                reference,
                cand,
                max_tokens,
            } => {
                let (reference, candidates) = parse_specs(&reference, &cand)?;
                let report = trajectory_report(
                    self.engine()?,
                    (&reference, &candidates),
                    &prompts,
                    max_tokens,
                )?;
                Ok(serde_json::to_value(report)?)
            }
            Request::Tokenize { text, plain } => tokenize_json(self.engine()?, &text, plain),
            Request::Info {} => Ok(serde_json::to_value(self.engine()?.metadata())?),
            Request::Load { model } => {
                let mut args = self.args.clone();
                args.model = Some(model);
                args.random_weights = None;
                args.layers = None;
                self.engine = args.load(true).map_err(|e| format!("{e:#}"));
                self.args = args;
                Ok(serde_json::to_value(self.engine()?.metadata())?)
            }
        }
    }

    fn complete(
        &self,
        prompt: &str,
        chat: bool,
        system: Option<String>,
        flags: &serde_json::Map<String, Value>,
    ) -> Result<Value> {
        let sampling = Flags::try_parse_from(flag_arguments(flags)?)
            .map_err(|e| anyhow!("{}", e.to_string().trim_end()))?
            .sampling;
        let engine = self.engine()?;
        let mut options = options(&sampling, &self.args)?;
        fit_to_model(&mut options, &sampling, engine)?;
        let mut quiet = |_: &engine::TokenEvent<'_>| {};
        let generation = if chat {
            let mut messages: Vec<ChatMessage> = system
                .map(|s| ChatMessage::new(Role::System, s))
                .into_iter()
                .collect();
            messages.push(ChatMessage::new(Role::User, prompt.to_string()));
            engine.chat(&messages, &options, &mut quiet)?
        } else {
            engine.generate(prompt, &options, &mut quiet)?
        };
        Ok(generation_json(&generation, engine.products()))
    }
}

/// `{"max-tokens": 32, "stop": ["a", "b"], "x": true}` as
/// `--max-tokens 32 --stop a --stop b --x`.
fn flag_arguments(flags: &serde_json::Map<String, Value>) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (name, value) in flags {
        let flag = format!("--{name}");
        let values = match value {
            Value::Array(items) => items.clone(),
            other => vec![other.clone()],
        };
        for v in values {
            match v {
                Value::Bool(true) => out.push(flag.clone()),
                Value::Bool(false) | Value::Null => {}
                Value::String(s) => out.extend([flag.clone(), s]),
                Value::Number(n) => out.extend([flag.clone(), n.to_string()]),
                other => bail!("flag '{name}': {other} is not a string, number or boolean"),
            }
        }
    }
    Ok(out)
}
