//! Printing results: text for people, or one JSON object on stdout's last
//! line, in the shapes the one-shot commands and the worker share.

use std::io::Read;

use anyhow::{Context, Result};
use engine::{Engine, Generation, ProductPath};
use serde::Serialize;
use serde_json::json;

/// Prints `value` as one line of JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string(value).context("writing JSON")?);
    Ok(())
}

/// The argument, or all of stdin when it is absent.
pub fn text_or_stdin(text: Option<&String>) -> Result<String> {
    match text {
        Some(t) => Ok(t.clone()),
        None => {
            let mut buffer = String::new();
            std::io::stdin()
                .read_to_string(&mut buffer)
                .context("reading the prompt from stdin")?;
            Ok(buffer)
        }
    }
}

/// A generation as `generate --json` prints it.
pub fn generation_json(g: &Generation, products: ProductPath) -> serde_json::Value {
    json!({
        "text": g.text,
        "token_ids": g.token_ids,
        "finish_reason": g.finish_reason,
        "decode": g.decode,
        "prompt_tokens": g.metrics.prompt_tokens,
        "prompt_tps": g.metrics.prompt_tps,
        "generation_tokens": g.metrics.generation_tokens,
        "generation_tps": g.metrics.generation_tps,
        "ttft_s": g.metrics.ttft_s,
        "peak_memory_bytes": g.metrics.peak_memory_bytes,
        "decode_host": g.metrics.decode_host,
        "weights": products.weights,
        "activations": products.activations,
        "cpu_kernels": products.cpu_kernels,
    })
}

/// `tokenize --json`'s object: the ids of `text` (`<bos>` first and
/// special-token text recognized, or with `plain` neither), their token
/// strings and their count.
pub fn tokenize_json(engine: &Engine, text: &str, plain: bool) -> Result<serde_json::Value> {
    let tokenizer = engine.tokenizer()?;
    let ids = if plain {
        tokenizer.encode_plain(text)?
    } else {
        tokenizer.encode(text, true)?
    };
    let tokens: Vec<String> = ids
        .iter()
        .map(|&id| tokenizer.id_to_token(id).unwrap_or_default())
        .collect();
    Ok(json!({"token_ids": ids, "tokens": tokens, "count": ids.len()}))
}
