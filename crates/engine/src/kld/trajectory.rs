//! Greedy-trajectory agreement: the same prompts decoded greedily under the
//! reference and under each candidate; how long the token ids agree.

use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::error::GenerateError;
use crate::options::GenerateOptions;

/// One line of a prompts file.
#[derive(Debug, Clone, Deserialize)]
pub struct TrajectoryPrompt {
    /// Raw text (with `<bos>` prepended), or a user message when `chat`.
    pub prompt: String,
    /// Wrap the prompt with the chat template.
    #[serde(default)]
    pub chat: bool,
}

/// Reads a prompts file: one JSON object per line (blank lines skipped).
pub fn parse_prompts(text: &str, file: &str) -> Result<Vec<TrajectoryPrompt>, GenerateError> {
    let prompts = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str::<TrajectoryPrompt>(l).map_err(|e| {
                GenerateError::Input(format!(
                    "{file}:{}: not a {{\"prompt\": …}} object: {e}",
                    i + 1
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if prompts.is_empty() {
        return Err(GenerateError::Input(format!("{file}: no prompts")));
    }
    Ok(prompts)
}

/// How one prompt's candidate trajectory compares with the reference's.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PromptAgreement {
    /// Tokens the reference generated.
    pub reference_tokens: usize,
    /// Tokens the candidate generated.
    pub candidate_tokens: usize,
    /// Length of the common prefix.
    pub common_prefix: usize,
    /// First position where they differ (None when one is a prefix of the other and equal length).
    pub first_divergence: Option<usize>,
}

/// Compares two id sequences.
pub fn agreement(reference: &[u32], candidate: &[u32]) -> PromptAgreement {
    let common = reference
        .iter()
        .zip(candidate)
        .take_while(|(a, b)| a == b)
        .count();
    let diverged = common < reference.len().max(candidate.len());
    PromptAgreement {
        reference_tokens: reference.len(),
        candidate_tokens: candidate.len(),
        common_prefix: common,
        first_divergence: diverged.then_some(common),
    }
}

/// 100 · mean common prefix / mean max(reference length, candidate length):
/// a candidate that stops early does not score 100.
pub fn trajectory_score(agreements: &[PromptAgreement]) -> f64 {
    let common: usize = agreements.iter().map(|a| a.common_prefix).sum();
    let longest: usize = agreements
        .iter()
        .map(|a| a.reference_tokens.max(a.candidate_tokens))
        .sum();
    if longest == 0 {
        return 100.0;
    }
    100.0 * common as f64 / longest as f64
}

/// Greedy ids for each prompt under `options` (whose sampler must be greedy).
pub fn greedy_ids(
    engine: &Engine,
    prompts: &[TrajectoryPrompt],
    options: &GenerateOptions,
) -> Result<Vec<Vec<u32>>, GenerateError> {
    prompts
        .iter()
        .map(|p| {
            let result = if p.chat {
                let messages = [gemma::chat_template::ChatMessage::new(
                    gemma::chat_template::Role::User,
                    p.prompt.clone(),
                )];
                engine.chat(&messages, options, &mut |_| {})?
            } else {
                engine.generate(&p.prompt, options, &mut |_| {})?
            };
            Ok(result.token_ids)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn early_stop_does_not_score_100() {
        let a = agreement(&[1, 2, 3, 4], &[1, 2]);
        assert_eq!((a.common_prefix, a.first_divergence), (2, Some(2)));
        assert_eq!(trajectory_score(&[a]), 50.0);
        let same = agreement(&[5, 6], &[5, 6]);
        assert_eq!(same.first_divergence, None);
        assert_eq!(trajectory_score(&[same]), 100.0);
        let b = agreement(&[1, 9, 3], &[1, 2, 3]);
        assert_eq!(b.first_divergence, Some(1));
    }

    #[test]
    fn prompts_file_lines_are_json_objects() {
        let p = parse_prompts(
            "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\", \"chat\": true}\n",
            "p.jsonl",
        )
        .unwrap();
        assert_eq!((p.len(), p[1].chat), (2, true));
        let e = parse_prompts("{\"text\": 1}", "p.jsonl")
            .unwrap_err()
            .to_string();
        assert!(e.contains("p.jsonl:1"), "{e}");
        assert!(parse_prompts("", "p.jsonl").is_err());
    }
}
