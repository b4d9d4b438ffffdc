//! KLD runs beside llama.cpp's `llama-perplexity --kl-divergence` (stock or
//! the TurboQuant fork), in its convention: `<bos>` at each chunk's start,
//! the second half of each chunk scored, against an f16 KV cache. Its
//! reference run writes the log-probabilities to a file that each candidate
//! run reads; ours is one `gemma-mlx kld` with every candidate. Used by
//! `compare-kld` and by `bench`'s sweep beside llama-perplexity.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::command;

/// Tokens per chunk (llama-perplexity's `-c`).
pub const CTX: usize = 512;

/// One engine's mean KLD of a spec.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Mean {
    /// Mean KL divergence from the f16 reference.
    pub kld: f64,
    /// Its standard error.
    pub error: f64,
    /// Positions whose top token agrees with the reference's, %.
    pub same_top_percent: f64,
}

/// `llama-perplexity` on one model and `chunks` chunks of a corpus.
pub struct Perplexity<'a> {
    /// The binary.
    pub binary: &'a Path,
    /// The GGUF file.
    pub model: &'a Path,
    /// Chunks of [`CTX`] tokens.
    pub chunks: usize,
    /// Threads (`-t`).
    pub threads: usize,
    /// Where the reference run writes its log-probabilities.
    pub base: PathBuf,
}

impl Perplexity<'_> {
    /// `llama-perplexity` with the settings every run shares, the fork's
    /// layer-adaptive modes off (`TURBO_LAYER_ADAPTIVE=0`, which stock
    /// llama.cpp does not read).
    fn command(&self, keys: &str, values: &str) -> Command {
        let mut c = Command::new(self.binary);
        c.arg("-m")
            .arg(self.model)
            .args(["-c", &CTX.to_string(), "--chunks", &self.chunks.to_string()])
            .args(["-t", &self.threads.to_string(), "-fa", "on"])
            .args(["-ctk", keys, "-ctv", values])
            .env("TURBO_LAYER_ADAPTIVE", "0");
        c
    }

    /// The f16 reference's log-probabilities over `corpus`, written to
    /// `base` for the candidates.
    pub fn write_base(&self, corpus: &Path) -> Result<()> {
        let mut c = self.command("f16", "f16");
        c.arg("-f")
            .arg(corpus)
            .arg("--kl-divergence-base")
            .arg(&self.base);
        println!("$ {}", command::describe(&c));
        let output = command::capture(&mut c)?;
        if !output.status.success() {
            bail!(
                "llama-perplexity (reference) failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    /// The mean KLD of keys and values in these types, against the base.
    pub fn mean(&self, keys: &str, values: &str) -> Result<Mean> {
        let mut c = self.command(keys, values);
        c.arg("--kl-divergence-base")
            .arg(&self.base)
            .arg("--kl-divergence");
        println!("$ {}", command::describe(&c));
        let output = command::capture(&mut c)?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if !output.status.success() {
            bail!("llama-perplexity -ctk {keys} -ctv {values} failed:\n{text}");
        }
        parse_mean(&text)
            .with_context(|| format!("llama-perplexity -ctk {keys} -ctv {values}: {text}"))
    }
}

/// `Mean    KLD:   0.009213 ±   0.000123` and `Same top p: 93.412 ± 0.155 %`
/// from llama-perplexity's KL divergence statistics (stock llama.cpp's and
/// the fork's print them alike).
fn parse_mean(text: &str) -> Result<Mean> {
    let pair = |label: &str| -> Result<(f64, f64)> {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .with_context(|| format!("no '{label}' line"))?;
        let numbers: Vec<f64> = line[line.find(':').map_or(0, |i| i + 1)..]
            .split(|c: char| c.is_whitespace() || c == '±' || c == '%')
            .filter_map(|w| w.parse().ok())
            .collect();
        match numbers[..] {
            [value, error, ..] => Ok((value, error)),
            _ => bail!("'{line}' holds no value ± error"),
        }
    };
    let (kld, error) = pair("Mean    KLD:")?;
    let (same_top_percent, _) = pair("Same top p:")?;
    Ok(Mean {
        kld,
        error,
        same_top_percent,
    })
}

/// Our mean KLD of every candidate spec (`ctk=…,ctv=…[,…]`), in that order,
/// from one `gemma-mlx kld` sweep in llama-perplexity's convention.
pub fn ours_means(
    binary: &Path,
    model: &Path,
    corpus: &Path,
    chunks: usize,
    candidates: &[String],
) -> Result<Vec<Mean>> {
    let mut c = Command::new(binary);
    c.arg("kld")
        .arg("--model")
        .arg(model)
        .arg("--corpus")
        .arg(corpus)
        .args(["--ctx", &CTX.to_string(), "--chunks", &chunks.to_string()])
        .args(["--second-half", "--ref", "ctk=f16,ctv=f16", "--json"]);
    for candidate in candidates {
        c.args(["--cand", candidate]);
    }
    println!("$ {}", command::describe(&c));
    let stdout = command::stdout_of(&mut c)?;
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .context("gemma-mlx kld printed no JSON")?;
    let candidates = report["candidates"]
        .as_array()
        .context("gemma-mlx kld's report has no candidates")?;
    candidates
        .iter()
        .map(|c| {
            let field = |name: &str| {
                c[name]
                    .as_f64()
                    .with_context(|| format!("candidate {} lacks {name}", c["spec"]))
            };
            Ok(Mean {
                kld: field("mean_kld")?,
                error: field("mean_kld_error")?,
                same_top_percent: field("same_top_percent")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_perplexitys_kld_statistics_are_read() {
        let text = "====== KL divergence statistics ======\n\
                    Mean    KLD:   0.009213 ±   0.000123\n\
                    Maximum KLD:   1.234567\n\
                    Same top p: 93.412 ± 0.155 %\n";
        let m = parse_mean(text).unwrap();
        assert_eq!(
            (m.kld, m.error, m.same_top_percent),
            (0.009213, 0.000123, 93.412)
        );
        assert!(parse_mean("Mean    KLD: nan").is_err());
    }
}
