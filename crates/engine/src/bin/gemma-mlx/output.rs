//! Printing results: text for people, or one JSON object on stdout's last line.

use std::io::Read;

use anyhow::{Context, Result};
use serde::Serialize;

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
