//! The subcommands.

use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use engine::options::{default_decode, default_prefill_chunk, default_steps_per_sync};
use engine::{ChatSession, Engine, GenerateOptions, Generation, KvSpec, ProductPath, TokenEvent};
use gemma::chat_template::{ChatMessage, Role};
use sample::SamplerConfig;
use serde_json::json;

use crate::args::{
    ChatArgs, Cli, Command, ConvertArgs, GenerateArgs, InfoArgs, SamplingArgs, TokenizeArgs,
};
use crate::model_args::{progress_bar, ModelArgs};
use crate::output::{print_json, text_or_stdin};

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

/// The options `sampling` asks for; what it leaves unset takes the defaults
/// of `model`'s device (which this places the computation on), but for
/// what [`fit_to_model`] settles once the model is loaded.
pub(crate) fn options(sampling: &SamplingArgs, model: &ModelArgs) -> Result<GenerateOptions> {
    let device = model.place()?;
    let spec = KvSpec::parse(sampling.kv.as_deref().unwrap_or(""))?;
    let sampler = SamplerConfig {
        temperature: sampling.temp,
        top_k: sampling.top_k,
        top_p: sampling.top_p,
        min_p: sampling.min_p,
        repetition_penalty: sampling.repetition_penalty,
        presence_penalty: sampling.presence_penalty,
        frequency_penalty: sampling.frequency_penalty,
        repetition_window: sampling.repetition_context_size,
        presence_window: sampling.presence_context_size,
        frequency_window: sampling.frequency_context_size,
        xtc_probability: sampling.xtc_probability,
        xtc_threshold: sampling.xtc_threshold,
        logit_bias: sampling.logit_bias.clone(),
        seed: sampling.seed,
        ..SamplerConfig::default()
    };
    sampler.validate()?;
    let defaults = GenerateOptions::default();
    Ok(GenerateOptions {
        max_tokens: sampling.max_tokens,
        sampler,
        stop_strings: sampling.stop.clone(),
        cache_format: spec.cache_format()?,
        kv_start: spec.start,
        prefill_chunk: sampling
            .prefill_chunk
            .unwrap_or(default_prefill_chunk(device)),
        decode: sampling.decode.unwrap_or_default(),
        steps_per_sync: sampling
            .steps_per_sync
            .map_or(default_steps_per_sync(device), |n| n as usize),
        ..defaults
    })
}

/// Settles what `options` (from [`options`]) take from the loaded model:
/// the decoding mode unless `sampling` asked for one ([`default_decode`]),
/// and XTC kept off the newline and end-of-sequence tokens, as mlx-lm's
/// command line does (a model without tokenizer: its end-of-sequence ids).
pub(crate) fn fit_to_model(
    options: &mut GenerateOptions,
    sampling: &SamplingArgs,
    engine: &Engine,
) -> Result<()> {
    if sampling.decode.is_none() {
        options.decode = default_decode(&engine.loaded.model)?;
    }
    if options.sampler.xtc_probability.is_none() {
        return Ok(());
    }
    let mut ids = engine.loaded.model.config.eos_token_ids.clone();
    if let Some(tokenizer) = engine.loaded.tokenizer.as_ref() {
        ids.extend(tokenizer.encode_plain("\n")?);
        ids.extend(tokenizer.stop_ids());
    }
    ids.sort_unstable();
    ids.dedup();
    options.sampler.xtc_special_tokens = ids;
    Ok(())
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

/// A generation as `generate --json` prints it.
pub(crate) fn generation_json(g: &Generation, products: ProductPath) -> serde_json::Value {
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
    let engine = args.model.load(args.json)?;
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

/// `tokenize --json`'s object: the ids of `text` (`<bos>` first and
/// special-token text recognized, or with `plain` neither), their token
/// strings and their count.
pub(crate) fn tokenize_json(engine: &Engine, text: &str, plain: bool) -> Result<serde_json::Value> {
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
