//! The subcommands.

use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use engine::{ChatSession, Engine, TokenEvent};
use gemma::chat_template::{ChatMessage, Role};
use gemma::load::TokenizerBuild;
use serde_json::json;

use crate::args::{ChatArgs, Cli, Command, ConvertArgs, GenerateArgs, InfoArgs, TokenizeArgs};
use crate::model_args::progress_bar;
use crate::output::{generation_json, print_json, text_or_stdin, tokenize_json};
use crate::sampling_args::{fit_to_model, options};

/// Runs the chosen subcommand.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate(args) => generate(args),
        Command::Chat(args) => chat(args),
        Command::Tokenize(args) => tokenize(args),
        Command::Info(args) => info(args),
        Command::Convert(args) => convert(args),
        Command::Kld(args) => crate::eval::kld(args),
        Command::Trajectory(args) => crate::eval::trajectory(args),
        Command::Bench(args) => crate::bench::bench(args),
        Command::Worker(args) => crate::worker::worker(args),
    }
}

/// Streams text to stdout, or to stderr when stdout carries JSON.
fn stream_to(json: bool) -> impl FnMut(&TokenEvent<'_>) {
    move |event: &TokenEvent<'_>| {
        if event.text.is_empty() {
            return;
        }
        if json {
            eprint!("{}", event.text);
            let _ = std::io::stderr().flush();
        } else {
            print!("{}", event.text);
            let _ = std::io::stdout().flush();
        }
    }
}

fn generate(args: GenerateArgs) -> Result<()> {
    let mut options = options(&args.sampling, &args.model)?;
    let ids = match args.synthetic_prompt {
        Some(n) => Some(synthetic_prompt(n)),
        None if !args.token_ids.is_empty() => Some(args.token_ids.clone()),
        None => None,
    };
    let prompt = match ids {
        Some(_) => String::new(),
        None => text_or_stdin(args.prompt.as_ref())?,
    };
    // A prompt of ids needs no encoder: the tokenizer holds its pieces only
    // (on the CPU, 424 → 362 MB at the peak for the default model).
    let tokenizer = if ids.is_some() {
        TokenizerBuild::WhenEncoding
    } else {
        TokenizerBuild::Now
    };
    let engine = args.model.load_with(args.json, tokenizer)?;
    fit_to_model(&mut options, &args.sampling, &engine)?;
    let mut on_text = stream_to(args.json);
    let result = if let Some(ids) = ids {
        engine.generate_ids(&ids, &options, &mut on_text)?
    } else if args.chat {
        engine.chat(
            &[ChatMessage::new(Role::User, prompt)],
            &options,
            &mut on_text,
        )?
    } else {
        engine.generate(&prompt, &options, &mut on_text)?
    };
    if args.json {
        eprintln!();
        print_json(&generation_json(&result, engine.products()))?;
    } else {
        println!();
    }
    eprintln!("{}", result.metrics.summary());
    Ok(())
}

/// `<bos>` then `n − 1` ids from a fixed linear congruential sequence over
/// ordinary vocabulary ids (1,000 to 200,000): the same prompt every run.
fn synthetic_prompt(n: usize) -> Vec<u32> {
    let mut state: u64 = 0x2545_f491;
    std::iter::once(2)
        .chain((1..n).map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            1_000 + ((state >> 33) % 199_000) as u32
        }))
        .take(n)
        .collect()
}

fn chat(args: ChatArgs) -> Result<()> {
    let mut options = options(&args.sampling, &args.model)?;
    let engine = args.model.load(args.json)?;
    fit_to_model(&mut options, &args.sampling, &engine)?;
    let mut session = ChatSession::new(&engine, args.system.as_deref(), options)?;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let Some(line) = lines.next() else { break };
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        let mut on_text = stream_to(args.json);
        let result = session.send(&engine, &line, &mut on_text)?;
        if args.json {
            eprintln!();
            let mut value = generation_json(&result, engine.products());
            value["cached_tokens"] = json!(session.cached_tokens());
            print_json(&value)?;
        } else {
            println!();
        }
        eprintln!("{}", result.metrics.summary());
    }
    Ok(())
}

fn tokenize(args: TokenizeArgs) -> Result<()> {
    let text = text_or_stdin(args.text.as_ref())?;
    let engine = args.model.load(true)?;
    let value = tokenize_json(&engine, &text, args.plain)?;
    if args.json {
        print_json(&value)
    } else {
        let ids: Vec<String> = value["token_ids"]
            .as_array()
            .map(|ids| ids.iter().map(|id| id.to_string()).collect())
            .unwrap_or_default();
        println!("{}", ids.join(" "));
        Ok(())
    }
}

fn info(args: InfoArgs) -> Result<()> {
    let engine: Engine = args.model.load(args.json)?;
    let meta = engine.metadata();
    if args.json {
        return print_json(&meta);
    }
    let value = serde_json::to_value(&meta)?;
    if let Some(fields) = value.as_object() {
        for (key, v) in fields {
            println!(
                "{key:>16}: {}",
                v.as_str().map_or_else(|| v.to_string(), str::to_string)
            );
        }
    }
    Ok(())
}

fn convert(args: ConvertArgs) -> Result<()> {
    let device = args.model.place()?;
    let source = args.model.source()?;
    let bar = progress_bar(&source, args.json);
    gemma::convert::convert(
        &source,
        args.model.dtype(device),
        &args.out,
        &mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    )?;
    bar.finish_and_clear();
    if args.json {
        print_json(&json!({"out": args.out}))
    } else {
        println!("wrote {}", args.out.display());
        Ok(())
    }
}
