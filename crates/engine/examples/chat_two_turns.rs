//! A two-turn chat whose second turn reuses the KV cache of the first: only
//! the tokens after what the cache already holds run through the model.
//! (The default model is Gemma 3 270M's base model: its replies are no
//! good answers; what this shows is the reuse.)
//!
//! `cargo run --release --example chat_two_turns`

mod common;

use anyhow::{ensure, Result};
use engine::{ChatSession, Engine, GenerateOptions};
use gemma::chat_template::ChatMessage;

/// Tokens of `messages` rendered with the chat template, ready for a reply.
fn rendered_tokens(engine: &Engine, messages: &[ChatMessage]) -> Result<usize> {
    let text = engine.loaded.chat_template.render(messages, true)?;
    Ok(engine.tokenizer()?.encode(&text, false)?.len())
}

/// Sends `user` and prints the reply; returns the prompt tokens the turn
/// ran and the tokens of the whole history it answered.
fn turn(engine: &Engine, session: &mut ChatSession, user: &str) -> Result<(usize, usize)> {
    println!("user: {user}");
    let reply = session.send(engine, user, &mut |_| {})?;
    let messages = session.messages();
    let history = rendered_tokens(engine, &messages[..messages.len() - 1])?;
    println!("model: {}", reply.text.trim());
    println!(
        "  ran {} of the {history} prompt tokens; the cache holds {}",
        reply.metrics.prompt_tokens,
        session.cached_tokens()
    );
    Ok((reply.metrics.prompt_tokens, history))
}

fn main() -> Result<()> {
    let engine = common::load_default_engine()?;
    let options = GenerateOptions {
        max_tokens: 12,
        ..GenerateOptions::default()
    };
    let mut session = ChatSession::new(&engine, None, options)?;

    let (first_ran, first_history) = turn(&engine, &mut session, "What is the capital of France?")?;
    ensure!(
        first_ran == first_history,
        "a fresh session runs the whole first prompt ({first_ran} of {first_history})"
    );
    let (second_ran, second_history) =
        turn(&engine, &mut session, "And what is the capital of Germany?")?;
    // The first prompt and the reply came from the cache: the second turn
    // ran fewer tokens than the history gained since the first prompt.
    ensure!(
        second_ran < second_history - first_history,
        "the second turn ran {second_ran} tokens of {second_history}"
    );
    Ok(())
}
