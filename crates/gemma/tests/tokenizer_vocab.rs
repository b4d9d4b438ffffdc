//! The tokenizer built from a small hand-made SentencePiece BPE vocabulary,
//! with ids worked out by hand from SentencePiece's BPE rules (and checked
//! with the `sentencepiece` package on the same vocabulary).

use gemma::tokenizer::{TokenType, Tokenizer, TokenizerError};

/// Id of the byte-fallback piece for `byte` in [`toy_vocab`].
fn byte_id(byte: u8) -> u32 {
    16 + u32::from(byte)
}

fn toy_vocab() -> (Vec<String>, Vec<f32>, Vec<TokenType>) {
    let mut entries: Vec<(String, f32, TokenType)> = vec![
        ("<pad>".into(), 0.0, TokenType::Control),
        ("<eos>".into(), 0.0, TokenType::Control),
        ("<bos>".into(), 0.0, TokenType::Control),
        ("<unk>".into(), 0.0, TokenType::Unknown),
        ("<start_of_turn>".into(), 0.0, TokenType::Control),
        ("<end_of_turn>".into(), 0.0, TokenType::Control),
        ("\n".into(), 0.0, TokenType::UserDefined),
        ("\u{2581}\u{2581}".into(), 0.0, TokenType::UserDefined),
        ("\u{2581}".into(), -10.0, TokenType::Normal),
        ("a".into(), -11.0, TokenType::Normal),
        ("b".into(), -12.0, TokenType::Normal),
        ("c".into(), -13.0, TokenType::Normal),
        ("ab".into(), -1.0, TokenType::Normal),
        ("bc".into(), 0.0, TokenType::Normal),
        ("\u{2581}a".into(), -2.0, TokenType::Normal),
        ("abc".into(), -3.0, TokenType::Normal),
    ];
    entries.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, TokenType::Byte)));
    let tokens = entries.iter().map(|e| e.0.clone()).collect();
    let scores = entries.iter().map(|e| e.1).collect();
    let types = entries.iter().map(|e| e.2).collect();
    (tokens, scores, types)
}

fn toy_tokenizer() -> Tokenizer {
    let (tokens, scores, types) = toy_vocab();
    Tokenizer::from_vocab(&tokens, &scores, &types).unwrap()
}

#[test]
fn merges_follow_the_merged_piece_scores() {
    let tokenizer = toy_tokenizer();
    // "bc" (score 0) beats "ab" (-1); then "a" + "bc" makes "abc".
    assert_eq!(tokenizer.encode_plain("abc").unwrap(), [15]);
    // "ab" (-1) beats "▁a" (-2); "▁ab" is no piece, so "▁" stays alone.
    assert_eq!(tokenizer.encode_plain(" ab").unwrap(), [8, 12]);
    assert_eq!(tokenizer.encode_plain(" a").unwrap(), [14]);
}

#[test]
fn user_defined_pieces_match_whole_and_unknown_characters_fall_back_to_bytes() {
    let tokenizer = toy_tokenizer();
    assert_eq!(tokenizer.encode_plain("  a\n").unwrap(), [7, 9, 6]);
    assert_eq!(tokenizer.encode_plain("   a").unwrap(), [7, 14]);
    assert_eq!(
        tokenizer.encode_plain("é").unwrap(),
        [byte_id(0xC3), byte_id(0xA9)]
    );
    assert_eq!(
        tokenizer
            .decode(&[byte_id(0xC3), byte_id(0xA9), 14])
            .unwrap(),
        "é a"
    );
}

#[test]
fn special_token_text_is_special_only_in_encode() {
    let tokenizer = toy_tokenizer();
    assert_eq!(
        tokenizer
            .encode("<start_of_turn>ab<end_of_turn>", true)
            .unwrap(),
        [2, 4, 12, 5]
    );
    let plain: Vec<u32> = "<eos>".bytes().map(byte_id).collect();
    assert_eq!(tokenizer.encode_plain("<eos>").unwrap(), plain);
    assert_eq!(tokenizer.stop_ids(), [1, 5]);
}

#[test]
fn bad_vocabularies_are_rejected() {
    let (mut tokens, scores, types) = toy_vocab();
    let short = Tokenizer::from_vocab(&tokens, &scores[1..], &types).unwrap_err();
    assert!(
        short.to_string().contains("must have the same length"),
        "{short}"
    );

    tokens[10] = "a".into();
    let duplicate = Tokenizer::from_vocab(&tokens, &scores, &types).unwrap_err();
    assert_eq!(
        duplicate.to_string(),
        "tokenizer vocabulary: token \"a\" appears twice, as ids 9 and 10"
    );

    let (mut tokens, scores, types) = toy_vocab();
    tokens[4] = "<start_of_image>".into();
    let missing = Tokenizer::from_vocab(&tokens, &scores, &types).unwrap_err();
    assert!(
        matches!(missing, TokenizerError::MissingSpecial("<start_of_turn>")),
        "{missing:?}"
    );
}

#[test]
fn token_types_use_sentencepiece_numbers() {
    assert_eq!(TokenType::from_number(1), Some(TokenType::Normal));
    assert_eq!(TokenType::from_number(3), Some(TokenType::Control));
    assert_eq!(TokenType::from_number(6), Some(TokenType::Byte));
    assert_eq!(TokenType::from_number(0), None);
    assert_eq!(TokenType::from_number(7), None);
}
