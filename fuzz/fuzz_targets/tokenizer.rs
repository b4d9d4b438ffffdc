//! The tokenizer: encoding arbitrary bytes with the default model's
//! vocabulary, decoding arbitrary ids, and loading arbitrary
//! `tokenizer.json` files.
//!
//! The first input byte picks the mode (modulo 3):
//! - 0: the rest is text (bytes that are not UTF-8 become U+FFFD); both
//!   encodings give ids inside the vocabulary that decode to the text (when
//!   it has no `▁`), `encode` with `<bos>` first, and the streaming decoder
//!   joins to the same text;
//! - 1: the rest is ids (little-endian u32, modulo the vocabulary size plus
//!   16, so some are outside): decoding fails exactly when an id is outside,
//!   the streaming decoder fails on the same id, and without U+FFFD on
//!   either side the streamed text equals the decoded text;
//! - 2: the rest is a `tokenizer.json`: loading never panics (a panic inside
//!   the tokenizers crate is an error), and a loaded tokenizer encodes and
//!   decodes without panicking.

#![no_main]

use gemma::tokenizer::{StreamingDecoder, Tokenizer, TokenizerError};
use gemma_fuzz::input::Input;
use gemma_fuzz::{model, scratch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        // `Tokenizer::from_file` turns the panics of the tokenizers crate on malformed
        // files into errors (catch_unwind); libFuzzer's panic hook would abort first.
        // This hook only prints the message (a backtrace per caught panic would
        // dominate the run); a panic nothing catches still aborts, in
        // libfuzzer-sys's wrapper, after its message.
        std::panic::set_hook(Box::new(|info| eprintln!("panic: {info}")));
        model::tokenizer();
    },
    |data: &[u8]| {
        let mut input = Input::new(data);
        match input.byte() % 3 {
            0 => encode(input.rest()),
            1 => decode(input.rest()),
            _ => load(input.rest()),
        }
    }
);

/// Mode 0: both encodings of the text round-trip.
fn encode(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let tokenizer = model::tokenizer();
    let ids = tokenizer.encode(&text, true).expect("encoding UTF-8 text");
    assert_eq!(ids.first(), Some(&tokenizer.bos_id()));
    model::check_round_trip(tokenizer, &text, &ids[1..], "encode");
    let plain = tokenizer
        .encode_plain(&text)
        .expect("plain encoding of UTF-8 text");
    model::check_round_trip(tokenizer, &text, &plain, "encode_plain");
}

/// Mode 1: decoding and streaming agree on arbitrary ids.
fn decode(bytes: &[u8]) {
    let tokenizer = model::tokenizer();
    let vocab = tokenizer.vocab_size();
    let ids: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) % (vocab as u32 + 16))
        .collect();
    let outside = ids.iter().copied().find(|&id| id as usize >= vocab);
    let decoded = tokenizer.decode(&ids);
    let mut streaming = StreamingDecoder::new(tokenizer);
    let mut joined = String::new();
    let mut failed = None;
    for &id in &ids {
        match streaming.push(id) {
            Ok(piece) => joined.push_str(&piece),
            Err(_) => {
                failed = Some(id);
                break;
            }
        }
    }
    joined.push_str(&streaming.finish());
    assert_eq!(
        failed, outside,
        "the streaming decoder fails on the first unknown id"
    );
    match (decoded, outside) {
        (Err(TokenizerError::UnknownId { id, .. }), Some(first)) => assert_eq!(id, first),
        (Ok(text), None) => {
            if !text.contains('\u{FFFD}') && !joined.contains('\u{FFFD}') {
                assert_eq!(joined, text, "streamed and decoded text differ: {ids:?}");
            }
        }
        (other, _) => panic!("decoding {ids:?} (first unknown {outside:?}) gave {other:?}"),
    }
}

/// Mode 2: an arbitrary `tokenizer.json` loads or fails, and a loaded one runs.
fn load(bytes: &[u8]) {
    let path = scratch::write("tokenizer.json", bytes);
    let Ok(tokenizer) = Tokenizer::from_file(&path) else {
        return;
    };
    let vocab = tokenizer.vocab_size();
    for text in [
        "Hello world",
        "<start_of_turn>user\n héllo 😀<end_of_turn>",
        "",
    ] {
        if let Ok(ids) = tokenizer.encode(text, true) {
            assert_eq!(ids.first(), Some(&tokenizer.bos_id()));
            let _ = tokenizer.decode(&ids);
        }
        if let Ok(ids) = tokenizer.encode_plain(text) {
            if ids.iter().all(|&id| (id as usize) < vocab) {
                let _ = tokenizer.decode(&ids);
            }
        }
    }
    let _ = tokenizer.to_json_string();
}
