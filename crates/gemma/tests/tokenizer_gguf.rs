//! The tokenizer built from the default GGUF file against SentencePiece's ids
//! (fixtures/tokenizer/reference.json, written by make_reference.py), the
//! tokenizer.json it writes, and streaming decoding.

use std::path::PathBuf;
use std::sync::OnceLock;

use gemma::gguf::GgufFile;
use gemma::tokenizer::{StreamingDecoder, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    name: String,
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
    special_cases: Vec<Case>,
}

fn model_path() -> PathBuf {
    match std::env::var_os("GEMMA_MLX_MODEL") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/model/gemma-3-270m-q4_k_m.gguf"),
    }
}

/// The tokenizer of the default model, or None (with a message) when the file is absent.
fn gguf_tokenizer() -> Option<&'static Tokenizer> {
    static TOKENIZER: OnceLock<Option<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = model_path();
            if !path.exists() {
                println!("skipped: no model file at {}", path.display());
                return None;
            }
            let file = GgufFile::open(&path).expect("open the GGUF file");
            Some(Tokenizer::from_gguf(&file).expect("build the tokenizer from the GGUF file"))
        })
        .as_ref()
}

fn reference() -> Reference {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/reference.json");
    let text = std::fs::read_to_string(&path).expect("read reference.json");
    serde_json::from_str(&text).expect("parse reference.json")
}

#[test]
fn gguf_tokenizer_matches_sentencepiece_ids() {
    let Some(tokenizer) = gguf_tokenizer() else {
        return;
    };
    for case in reference().cases {
        let ids = tokenizer.encode_plain(&case.text).unwrap();
        assert_eq!(ids, case.ids, "case {}", case.name);
        assert_eq!(
            tokenizer.decode(&ids).unwrap(),
            case.text,
            "case {}",
            case.name
        );
    }
}

#[test]
fn thirty_three_spaces_are_one_31_space_piece_and_one_2_space_piece() {
    let Some(tokenizer) = gguf_tokenizer() else {
        return;
    };
    let ids = tokenizer.encode_plain(&" ".repeat(33)).unwrap();
    assert_eq!(ids, [167, 138]);
    assert_eq!(tokenizer.id_to_token(167).unwrap(), "\u{2581}".repeat(31));
    assert_eq!(tokenizer.id_to_token(138).unwrap(), "\u{2581}".repeat(2));
}

#[test]
fn encode_reads_special_token_text_as_special_tokens() {
    let Some(tokenizer) = gguf_tokenizer() else {
        return;
    };
    for case in reference().special_cases {
        let ids = tokenizer.encode(&case.text, false).unwrap();
        assert_eq!(ids, case.ids, "case {}", case.name);
        assert_eq!(
            tokenizer.decode(&ids).unwrap(),
            case.text,
            "case {}",
            case.name
        );
        let with_bos = tokenizer.encode(&case.text, true).unwrap();
        assert_eq!(with_bos.first(), Some(&2), "case {}", case.name);
        assert_eq!(&with_bos[1..], case.ids.as_slice(), "case {}", case.name);
    }
}

#[test]
fn gguf_special_token_ids() {
    let Some(tokenizer) = gguf_tokenizer() else {
        return;
    };
    let special = tokenizer.special_tokens();
    assert_eq!(special.bos, 2);
    assert_eq!(special.eos, 1);
    assert_eq!(special.start_of_turn, 105);
    assert_eq!(special.end_of_turn, 106);
    assert_eq!(tokenizer.bos_id(), 2);
    assert_eq!(tokenizer.stop_ids(), [1, 106]);
    assert_eq!(tokenizer.vocab_size(), 262_144);
    assert_eq!(
        tokenizer.id_to_token(105).as_deref(),
        Some("<start_of_turn>")
    );
    assert_eq!(tokenizer.token_to_id("<end_of_turn>"), Some(106));
}

#[test]
fn decode_rejects_ids_outside_the_vocabulary() {
    let Some(tokenizer) = gguf_tokenizer() else {
        return;
    };
    let error = tokenizer.decode(&[2, 262_144]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "token id 262144 is outside the vocabulary of 262144 tokens"
    );
}

#[test]
fn written_tokenizer_json_gives_the_same_ids() {
    let Some(tokenizer) = gguf_tokenizer() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    tokenizer.save(&path).unwrap();
    let reloaded = Tokenizer::from_file(&path).unwrap();

    assert_eq!(reloaded.special_tokens(), tokenizer.special_tokens());
    assert_eq!(reloaded.vocab_size(), 262_144);
    let reference = reference();
    for case in &reference.cases {
        assert_eq!(
            reloaded.encode_plain(&case.text).unwrap(),
            case.ids,
            "case {}",
            case.name
        );
    }
    for case in &reference.special_cases {
        assert_eq!(
            reloaded.encode(&case.text, false).unwrap(),
            case.ids,
            "case {}",
            case.name
        );
        assert_eq!(
            reloaded.decode(&case.ids).unwrap(),
            case.text,
            "case {}",
            case.name
        );
    }
}

#[test]
fn streaming_decoder_never_splits_a_character() {
    let Some(tokenizer) = gguf_tokenizer() else {
        return;
    };
    let text = "日本語 😀🫠🪿 𠀀𪚥 ok";
    let ids = tokenizer.encode_plain(text).unwrap();
    let first_byte_piece = ids
        .iter()
        .position(|&id| tokenizer.id_to_token(id).as_deref() == Some("<0xF0>"))
        .expect("the text needs byte-fallback pieces");

    let mut decoder = StreamingDecoder::new(tokenizer);
    let mut streamed = String::new();
    for (position, &id) in ids.iter().enumerate() {
        let piece = decoder.push(id).unwrap();
        if position == first_byte_piece {
            assert_eq!(
                piece, "",
                "a lone lead byte must wait for the rest of its character"
            );
        }
        streamed.push_str(&piece);
        assert!(
            text.starts_with(&streamed),
            "{streamed:?} is not a prefix of the text"
        );
    }
    streamed.push_str(&decoder.finish());
    assert_eq!(streamed, text);
    assert_eq!(streamed, tokenizer.decode(&ids).unwrap());
}

#[test]
fn streaming_decoder_replaces_bytes_that_cannot_form_a_character() {
    let Some(tokenizer) = gguf_tokenizer() else {
        return;
    };
    let byte = |name: &str| tokenizer.token_to_id(name).unwrap();
    let a = tokenizer.token_to_id("a").unwrap();
    let mut decoder = StreamingDecoder::new(tokenizer);
    assert_eq!(decoder.push(byte("<0xFF>")).unwrap(), "\u{FFFD}");
    assert_eq!(decoder.push(byte("<0xE2>")).unwrap(), "");
    assert_eq!(decoder.push(a).unwrap(), "\u{FFFD}a");
    assert_eq!(decoder.push(byte("<0xE2>")).unwrap(), "");
    assert_eq!(decoder.push(byte("<0x82>")).unwrap(), "");
    assert_eq!(decoder.finish(), "\u{FFFD}");
    assert_eq!(decoder.push(byte("<0xE2>")).unwrap(), "");
    assert_eq!(decoder.push(byte("<0x82>")).unwrap(), "");
    assert_eq!(decoder.push(byte("<0xAC>")).unwrap(), "€");
}

#[test]
fn a_deferred_tokenizer_decodes_from_its_pieces_and_encodes_once_asked() {
    let Some(eager) = gguf_tokenizer() else {
        return;
    };
    let file = GgufFile::open(&model_path()).expect("open the GGUF file");
    let deferred = Tokenizer::from_gguf_deferred(&file).expect("read the pieces");
    drop(file);
    assert_eq!(deferred.vocab_size(), eager.vocab_size());
    assert_eq!(deferred.special_tokens(), eager.special_tokens());
    for id in 0..eager.vocab_size() as u32 {
        assert_eq!(deferred.id_to_token(id), eager.id_to_token(id), "id {id}");
    }
    assert_eq!(
        deferred.token_to_id("<start_of_turn>"),
        eager.token_to_id("<start_of_turn>")
    );
    // Every reference text's ids decode to what the pipeline gives (byte
    // fallback, spaces, special tokens), before any encoder exists.
    let reference = reference();
    for case in reference.cases.iter().chain(&reference.special_cases) {
        assert_eq!(
            deferred.decode(&case.ids).unwrap(),
            eager.decode(&case.ids).unwrap(),
            "{}",
            case.name
        );
    }
    // Encoding builds the encoder from the file, with the same ids.
    for case in &reference.cases {
        assert_eq!(
            deferred.encode_plain(&case.text).unwrap(),
            eager.encode_plain(&case.text).unwrap(),
            "{}",
            case.name
        );
        assert_eq!(
            deferred.encode(&case.text, true).unwrap(),
            eager.encode(&case.text, true).unwrap()
        );
    }
}
