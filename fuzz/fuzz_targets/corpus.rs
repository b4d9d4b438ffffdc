//! Corpus files of `gemma-mlx kld`: read as bytes, refused unless UTF-8,
//! encoded with SentencePiece's plain encoding, cut into chunks (the steps
//! of `kld_report` in `crates/engine/src/bin/gemma-mlx/eval.rs`).
//!
//! The input is three setting bytes (chunk length, most chunks, flags:
//! `<bos>` first, second half) and then the file. Invariants: bytes that are
//! not UTF-8 are an error, never a panic; the ids are inside the vocabulary
//! and decode to the text (see [`gemma_fuzz::model::check_round_trip`]);
//! chunking gives `min(stream / ctx, chunks)` chunks of exactly `ctx` ids,
//! cut in order from the stream (the ids, after a `<bos>` when asked, as
//! llama-perplexity reads a text), each chunk's first id replaced by `<bos>`
//! when asked, or an error when that is none or `ctx < 2`.

#![no_main]

use engine::kld::sweep::{chunks, ChunkSettings};
use gemma_fuzz::input::Input;
use gemma_fuzz::model;
use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        model::tokenizer();
    },
    |data: &[u8]| {
        let mut input = Input::new(data);
        let ctx = usize::from(input.byte());
        let most = usize::from(input.byte() % 16);
        let flags = input.byte();
        let file = input.rest();
        let Ok(text) = String::from_utf8(file.to_vec()) else {
            assert!(std::str::from_utf8(file).is_err());
            return;
        };
        let tokenizer = model::tokenizer();
        let ids = tokenizer.encode_plain(&text).expect("plain encoding of UTF-8 text");
        model::check_round_trip(tokenizer, &text, &ids, "encode_plain");
        let settings = ChunkSettings {
            ctx,
            chunks: most,
            bos: (flags & 1 == 1).then(|| tokenizer.bos_id()),
            second_half: flags & 2 == 2,
            two_forwards: false,
        };
        let stream: Vec<u32> = settings.bos.iter().chain(&ids).copied().collect();
        let expected = if ctx < 2 { 0 } else { (stream.len() / ctx).min(most) };
        match chunks(&ids, &settings) {
            Ok(list) => {
                assert_eq!(list.len(), expected, "ctx {ctx}, {} ids", ids.len());
                for (i, chunk) in list.iter().enumerate() {
                    let source = &stream[i * ctx..(i + 1) * ctx];
                    assert_eq!(chunk.len(), ctx);
                    assert_eq!(chunk[1..], source[1..]);
                    let first = settings.bos.unwrap_or(source[0]);
                    assert_eq!(chunk[0], first);
                }
            }
            Err(_) => assert_eq!(expected, 0, "ctx {ctx}, {} ids, {most} chunks", ids.len()),
        }
    }
);
