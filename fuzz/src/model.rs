//! The default model's GGUF file and the tokenizer built from it, once per
//! process, for the targets that encode text with the real vocabulary.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gemma::gguf::GgufFile;
use gemma::tokenizer::Tokenizer;

/// The default model's GGUF file: `$GEMMA_MLX_MODEL`, else
/// `<workspace>/target/model/gemma-3-270m-q4_k_m.gguf` (what the tests use;
/// `cargo xtask setup` fetches it).
pub fn default_model_path() -> PathBuf {
    std::env::var_os("GEMMA_MLX_MODEL").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/model/gemma-3-270m-q4_k_m.gguf"),
        PathBuf::from,
    )
}

/// The default model's tokenizer (262,144 pieces), built on first use.
pub fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = default_model_path();
        let file = GgufFile::open(&path).unwrap_or_else(|e| {
            panic!("{e}: the tokenizer targets need the default model (run `cargo xtask setup`)")
        });
        Tokenizer::from_gguf(&file).expect("the default model's tokenizer")
    })
}

/// The piece SentencePiece writes for a space; text holding it does not
/// survive encoding and decoding (it decodes as a space).
pub const SPACE_MARKER: char = '\u{2581}';

/// Checks the guarantees of encoding `text` with `tokenizer`: every id is
/// inside the vocabulary, decoding gives `text` back when it has no
/// [`SPACE_MARKER`], and the streaming decoder's pieces join to the same text.
/// `ids` are `text`'s encoding; `what` names the encoding in messages.
pub fn check_round_trip(tokenizer: &Tokenizer, text: &str, ids: &[u32], what: &str) {
    let vocab = tokenizer.vocab_size();
    assert!(
        ids.iter().all(|&id| (id as usize) < vocab),
        "{what}: an id is outside the vocabulary of {vocab}: {ids:?}"
    );
    let decoded = tokenizer
        .decode(ids)
        .expect("decoding ids the tokenizer made");
    if !text.contains(SPACE_MARKER) {
        assert_eq!(
            decoded, text,
            "{what}: decode(encode(text)) != text; ids {ids:?}"
        );
    }
    let mut streaming = gemma::tokenizer::StreamingDecoder::new(tokenizer);
    let mut joined = String::new();
    for &id in ids {
        joined.push_str(
            &streaming
                .push(id)
                .expect("streaming an id the tokenizer made"),
        );
    }
    joined.push_str(&streaming.finish());
    assert_eq!(
        joined, decoded,
        "{what}: the streaming decoder's pieces differ from decode(); ids {ids:?}"
    );
}
