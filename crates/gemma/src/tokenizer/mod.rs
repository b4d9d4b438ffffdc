//! Gemma's tokenizer: SentencePiece BPE with byte fallback, run by the
//! `tokenizers` crate.
//!
//! A [`Tokenizer`] comes from a `tokenizer.json` ([`Tokenizer::from_file`]),
//! from a GGUF file's vocabulary ([`Tokenizer::from_gguf`]) or from plain lists
//! of pieces, scores and types ([`Tokenizer::from_vocab`]). Built from a
//! vocabulary it gives exactly SentencePiece's ids (see [`vocab`] for how), and
//! [`Tokenizer::to_json_string`] writes it as a `tokenizer.json` that
//! `tokenizers` and `transformers` load with the same ids. A model loader
//! takes [`Tokenizer::from_gguf_deferred`]: the pieces only, the encoder built
//! from the file when something is first encoded, so that a run whose prompt
//! is already ids never holds it.
//!
//! Two encodings:
//! - [`Tokenizer::encode`] recognizes special-token text (`<start_of_turn>`,
//!   `<bos>`, ...) in the input as the special token, as a chat prompt needs.
//! - [`Tokenizer::encode_plain`] is SentencePiece's own encoding: special-token
//!   text is ordinary text, split into ordinary pieces; user-defined pieces
//!   (newline and space runs, HTML tags) are still matched, as SentencePiece
//!   matches them. Use it for corpora.

mod gguf;
mod pieces;
mod streaming;
pub mod vocab;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use pieces::Pieces;

pub use streaming::StreamingDecoder;
pub use vocab::TokenType;

/// What went wrong building or using a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A `tokenizer.json` could not be read, parsed or written.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// The problem.
        message: String,
    },
    /// A GGUF file's tokenizer metadata is missing or malformed.
    #[error("{path}: {message}")]
    Gguf {
        /// The GGUF file.
        path: PathBuf,
        /// The problem.
        message: String,
    },
    /// The vocabulary cannot make a tokenizer.
    #[error("tokenizer vocabulary: {0}")]
    Vocab(String),
    /// A special token Gemma needs is not in the vocabulary.
    #[error("tokenizer vocabulary: special token {0} is missing")]
    MissingSpecial(&'static str),
    /// An id is outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownId {
        /// The id.
        id: u32,
        /// The vocabulary's size.
        vocab_size: usize,
    },
    /// Encoding or decoding failed inside `tokenizers`.
    #[error("tokenizer: {0}")]
    Run(String),
}

/// The ids of the special tokens Gemma's generation loop uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `<bos>`, which starts every sequence.
    pub bos: u32,
    /// `<eos>`, the end of a document.
    pub eos: u32,
    /// `<start_of_turn>`, which opens a chat turn.
    pub start_of_turn: u32,
    /// `<end_of_turn>`, which closes a chat turn.
    pub end_of_turn: u32,
}

impl SpecialTokens {
    /// Looks the special tokens up by their text (`id_of` gives a piece's id).
    fn look_up(id_of: impl Fn(&str) -> Option<u32>) -> Result<SpecialTokens, TokenizerError> {
        let id = |name: &'static str| id_of(name).ok_or(TokenizerError::MissingSpecial(name));
        Ok(SpecialTokens {
            bos: id("<bos>")?,
            eos: id("<eos>")?,
            start_of_turn: id("<start_of_turn>")?,
            end_of_turn: id("<end_of_turn>")?,
        })
    }
}

/// Gemma's tokenizer: text to ids and back.
#[derive(Debug)]
pub struct Tokenizer {
    /// The `tokenizers` pipeline: built at once, or from `deferred` on first use.
    pipeline: OnceLock<tokenizers::Tokenizer>,
    /// The GGUF file the pipeline is built from when first needed.
    deferred: Option<PathBuf>,
    /// The pieces by id, which a deferred tokenizer decodes with.
    pieces: Option<Pieces>,
    /// A copy of the pipeline that does not recognize special-token text, made on first use.
    plain: OnceLock<tokenizers::Tokenizer>,
    special: SpecialTokens,
    /// The number of ids, counted once (`tokenizers` counts by building the whole vocabulary).
    vocab_size: usize,
}

impl Tokenizer {
    /// Loads a `tokenizer.json` (Hugging Face format). The `tokenizers` crate panics on some
    /// malformed files instead of failing (a JSON syntax error inside `"decoder"`, a bad
    /// precompiled normalizer); such a file is an error here like any other malformed file.
    pub fn from_file(path: &Path) -> Result<Tokenizer, TokenizerError> {
        let file_error = |message: String| TokenizerError::File {
            path: path.to_path_buf(),
            message,
        };
        let loaded = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_file(path))
            .map_err(|panic| file_error(format!("malformed: {}", panic_text(panic.as_ref()))))?;
        let pipeline = loaded.map_err(|e| file_error(e.to_string()))?;
        Tokenizer::from_pipeline(pipeline)
    }

    /// Builds the tokenizer from a SentencePiece BPE vocabulary: pieces (spaces written as `▁`),
    /// scores and types, each listed in id order.
    pub fn from_vocab(
        tokens: &[String],
        scores: &[f32],
        types: &[TokenType],
    ) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_pipeline(vocab::build_pipeline(tokens, scores, types)?)
    }

    /// Wraps a `tokenizers` pipeline, looking up Gemma's special tokens.
    fn from_pipeline(pipeline: tokenizers::Tokenizer) -> Result<Tokenizer, TokenizerError> {
        let special = SpecialTokens::look_up(|name| pipeline.token_to_id(name))?;
        let vocab_size = pipeline.get_vocab_size(true);
        Ok(Tokenizer {
            pipeline: OnceLock::from(pipeline),
            deferred: None,
            pieces: None,
            plain: OnceLock::new(),
            special,
            vocab_size,
        })
    }

    /// A tokenizer that holds `pieces` and builds its pipeline from the GGUF
    /// file at `path` when first needed.
    fn deferred(path: &Path, tokens: &[String]) -> Result<Tokenizer, TokenizerError> {
        let pieces = Pieces::new(tokens);
        let special = SpecialTokens::look_up(|name| pieces.id(name))?;
        Ok(Tokenizer {
            pipeline: OnceLock::new(),
            deferred: Some(path.to_path_buf()),
            vocab_size: tokens.len(),
            pieces: Some(pieces),
            plain: OnceLock::new(),
            special,
        })
    }

    /// The pipeline, built now from the GGUF file if it was deferred.
    fn pipeline(&self) -> Result<&tokenizers::Tokenizer, TokenizerError> {
        if let Some(pipeline) = self.pipeline.get() {
            return Ok(pipeline);
        }
        let path = self.deferred.as_deref().ok_or_else(|| {
            TokenizerError::Run(
                "the tokenizer has neither a pipeline nor a file to build it from".into(),
            )
        })?;
        let file = crate::gguf::GgufFile::open(path).map_err(|e| TokenizerError::Gguf {
            path: path.to_path_buf(),
            message: format!("reopening it to build the tokenizer's encoder: {e}"),
        })?;
        let built = Tokenizer::from_gguf(&file)?;
        if built.vocab_size != self.vocab_size || built.special != self.special {
            return Err(TokenizerError::Gguf {
                path: path.to_path_buf(),
                message: "its vocabulary changed since the model was loaded".into(),
            });
        }
        let pipeline = built.pipeline.into_inner().ok_or_else(|| {
            TokenizerError::Run("a tokenizer built from a GGUF file has no pipeline".into())
        })?;
        Ok(self.pipeline.get_or_init(|| pipeline))
    }

    /// Encodes `text`, reading special-token text such as `<start_of_turn>` as the special
    /// token; puts `<bos>` first when `add_bos`.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        if add_bos {
            ids.push(self.special.bos);
        }
        ids.extend(run_encode(self.pipeline()?, text)?);
        Ok(ids)
    }

    /// Encodes `text` exactly as SentencePiece does, with no `<bos>`: special-token text is
    /// ordinary text (`<eos>` becomes `<`, `eos`, `>`), while user-defined pieces are still
    /// matched whole.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let pipeline = self.pipeline()?;
        let plain = self.plain.get_or_init(|| {
            let mut plain = pipeline.clone();
            plain.set_encode_special_tokens(true);
            plain
        });
        run_encode(plain, text)
    }

    /// The text of `ids`, special tokens included as their text; byte-fallback pieces that do
    /// not form valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(TokenizerError::UnknownId {
                id,
                vocab_size: self.vocab_size,
            });
        }
        if self.pieces.is_some() {
            let mut decoder = StreamingDecoder::new(self);
            let mut text = String::new();
            for &id in ids {
                text.push_str(&decoder.push(id)?);
            }
            text.push_str(&decoder.finish());
            return Ok(text);
        }
        self.pipeline()?
            .decode(ids, false)
            .map_err(|e| TokenizerError::Run(e.to_string()))
    }

    /// The piece with id `id`, as written in the vocabulary (`▁` for spaces).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match &self.pieces {
            Some(pieces) => pieces.get(id).map(str::to_owned),
            None => self.pipeline.get()?.id_to_token(id),
        }
    }

    /// The id of the piece `token`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.pieces {
            Some(pieces) => pieces.id(token),
            None => self.pipeline.get()?.token_to_id(token),
        }
    }

    /// The number of ids, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Gemma's special token ids.
    pub fn special_tokens(&self) -> SpecialTokens {
        self.special
    }

    /// The id of `<bos>`.
    pub fn bos_id(&self) -> u32 {
        self.special.bos
    }

    /// The ids that end generation: `<eos>` and `<end_of_turn>`.
    pub fn stop_ids(&self) -> [u32; 2] {
        [self.special.eos, self.special.end_of_turn]
    }

    /// The tokenizer as `tokenizer.json` text (Hugging Face format).
    pub fn to_json_string(&self) -> Result<String, TokenizerError> {
        self.pipeline()?
            .to_string(false)
            .map_err(|e| TokenizerError::Run(format!("writing tokenizer.json: {e}")))
    }

    /// Writes the tokenizer to `path` as a `tokenizer.json`.
    pub fn save(&self, path: &Path) -> Result<(), TokenizerError> {
        let file_error = |message: String| TokenizerError::File {
            path: path.to_path_buf(),
            message,
        };
        let json = self
            .to_json_string()
            .map_err(|e| file_error(e.to_string()))?;
        std::fs::write(path, json).map_err(|e| file_error(e.to_string()))
    }
}

/// The message a panic carried (a `&str` or `String` payload), for an error.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("the tokenizers crate panicked while reading it")
}

/// Runs `pipeline` on `text` without post-processing (no `<bos>`).
fn run_encode(pipeline: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>, TokenizerError> {
    pipeline
        .encode_fast(text, false)
        .map(|encoding| encoding.get_ids().to_vec())
        .map_err(|e| TokenizerError::Run(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_the_tokenizers_crate_panics_on_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        // A JSON syntax error inside "decoder": tokenizers 0.22 panics ("Helper") on it.
        std::fs::write(&path, r#"{"decoder": {1: 2}}"#).unwrap();
        let error = Tokenizer::from_file(&path).unwrap_err();
        let TokenizerError::File {
            path: named,
            message,
        } = &error
        else {
            panic!("expected a file error, got {error:?}");
        };
        assert_eq!(named, &path);
        assert!(
            message.starts_with("malformed: Helper: Error(\"key must be a string\""),
            "{message}"
        );
    }
}
