//! Loads the default model and streams a short greedy completion, printing
//! each piece of text as its token arrives.
//!
//! `cargo run --release --example stream_completion [PROMPT]`

mod common;

use std::io::Write;

use anyhow::{ensure, Result};
use engine::GenerateOptions;

fn main() -> Result<()> {
    let prompt = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "The three primary colours are".into());
    let engine = common::load_default_engine()?;
    let options = GenerateOptions {
        max_tokens: 16,
        ..GenerateOptions::default()
    };

    let mut stdout = std::io::stdout();
    print!("{prompt}");
    let mut streamed = String::new();
    let mut written = stdout.flush();
    let generation = engine.generate(&prompt, &options, &mut |event| {
        streamed.push_str(event.text);
        if written.is_ok() {
            print!("{}", event.text);
            written = stdout.flush();
        }
    })?;
    written?;
    println!();

    // The pieces handed to the callback add up to the final text.
    ensure!(
        streamed == generation.text,
        "streamed {streamed:?}, returned {:?}",
        generation.text
    );
    ensure!(!generation.token_ids.is_empty(), "no token generated");
    eprintln!(
        "finish: {:?} | {}",
        generation.finish_reason,
        generation.metrics.summary()
    );
    Ok(())
}
