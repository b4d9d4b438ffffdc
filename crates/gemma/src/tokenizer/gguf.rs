//! Building the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! llama.cpp's converter writes user-defined pieces with their `▁` turned into
//! spaces ("pre-normalized"); this module turns them back, so the vocabulary
//! is SentencePiece's again.

use std::path::Path;

use super::vocab::{TokenType, SPACE_MARKER};
use super::{Tokenizer, TokenizerError};
use crate::gguf::{GgufFile, GgufValue};

impl Tokenizer {
    /// Builds the tokenizer from the vocabulary in a GGUF file (`tokenizer.ggml.model` must be
    /// "llama", SentencePiece), checking that the file's BOS and EOS ids are `<bos>` and `<eos>`.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let metadata = Metadata::checked(file)?;
        let types = metadata.types()?;
        let tokens = metadata.tokens(&types)?;
        let scores = metadata.scores()?;
        let tokenizer = Tokenizer::from_vocab(&tokens, &scores, &types)?;
        metadata.check_ids(tokenizer.special)?;
        Ok(tokenizer)
    }

    /// As [`Tokenizer::from_gguf`], but holding only the pieces: the encoder
    /// is built from the file (reopened at its path) when something is first
    /// encoded. Decoding joins the pieces as [`super::StreamingDecoder`] does.
    pub fn from_gguf_deferred(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let metadata = Metadata::checked(file)?;
        let types = metadata.types()?;
        let tokens = metadata.tokens(&types)?;
        let tokenizer = Tokenizer::deferred(file.path(), &tokens)?;
        metadata.check_ids(tokenizer.special)?;
        Ok(tokenizer)
    }
}

impl<'a> Metadata<'a> {
    /// The metadata of `file`, checked to describe a SentencePiece tokenizer
    /// without a dummy space prefix.
    fn checked(file: &'a GgufFile) -> Result<Metadata<'a>, TokenizerError> {
        let metadata = Metadata {
            file,
            path: file.path(),
        };
        let model = metadata.string("tokenizer.ggml.model")?;
        if model != "llama" {
            return Err(metadata.error(format!(
                "tokenizer.ggml.model is {model:?}; only \"llama\" (SentencePiece) is supported"
            )));
        }
        if metadata.flag("tokenizer.ggml.add_space_prefix")? == Some(true) {
            return Err(metadata.error(
                "tokenizer.ggml.add_space_prefix is true; only tokenizers without a dummy space prefix are supported"
                    .to_owned(),
            ));
        }
        Ok(metadata)
    }

    /// Checks the file's BOS and EOS ids against `<bos>` and `<eos>`.
    fn check_ids(&self, special: super::SpecialTokens) -> Result<(), TokenizerError> {
        self.check_id("tokenizer.ggml.bos_token_id", special.bos)?;
        self.check_id("tokenizer.ggml.eos_token_id", special.eos)
    }
}

/// Typed access to one GGUF file's metadata, with errors that name the file and key.
struct Metadata<'a> {
    file: &'a GgufFile,
    path: &'a Path,
}

impl Metadata<'_> {
    fn error(&self, message: String) -> TokenizerError {
        TokenizerError::Gguf {
            path: self.path.to_path_buf(),
            message,
        }
    }

    fn get(&self, key: &str) -> Result<&GgufValue, TokenizerError> {
        self.file
            .get(key)
            .ok_or_else(|| self.error(format!("metadata key {key} is missing")))
    }

    fn string(&self, key: &str) -> Result<&str, TokenizerError> {
        let value = self.get(key)?;
        value
            .as_str()
            .ok_or_else(|| self.error(format!("{key} is a {}, not a string", value.type_name())))
    }

    fn flag(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(GgufValue::Bool(flag)) => Ok(Some(*flag)),
            Some(other) => Err(self.error(format!("{key} is a {}, not a bool", other.type_name()))),
        }
    }

    fn array(&self, key: &str) -> Result<&[GgufValue], TokenizerError> {
        let value = self.get(key)?;
        value
            .as_array()
            .ok_or_else(|| self.error(format!("{key} is a {}, not an array", value.type_name())))
    }

    fn types(&self) -> Result<Vec<TokenType>, TokenizerError> {
        let key = "tokenizer.ggml.token_type";
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(id, value)| {
                value
                    .as_i64()
                    .and_then(TokenType::from_number)
                    .ok_or_else(|| {
                        self.error(format!(
                            "{key}[{id}] is not a token type (1 to 6): {value:?}"
                        ))
                    })
            })
            .collect()
    }

    /// The pieces, with spaces in user-defined pieces turned back into `▁`.
    fn tokens(&self, types: &[TokenType]) -> Result<Vec<String>, TokenizerError> {
        let key = "tokenizer.ggml.tokens";
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(id, value)| {
                let piece = value
                    .as_str()
                    .ok_or_else(|| self.error(format!("{key}[{id}] is not a string")))?;
                Ok(match types.get(id) {
                    Some(TokenType::UserDefined) => piece.replace(' ', SPACE_MARKER),
                    _ => piece.to_owned(),
                })
            })
            .collect()
    }

    fn scores(&self) -> Result<Vec<f32>, TokenizerError> {
        let key = "tokenizer.ggml.scores";
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(id, value)| {
                value
                    .as_f64()
                    .map(|score| score as f32)
                    .ok_or_else(|| self.error(format!("{key}[{id}] is not a number")))
            })
            .collect()
    }

    /// Checks that the id stored under `key`, when present, is `expected`.
    fn check_id(&self, key: &str, expected: u32) -> Result<(), TokenizerError> {
        let Some(value) = self.file.get(key) else {
            return Ok(());
        };
        match value.as_u64() {
            Some(id) if id == u64::from(expected) => Ok(()),
            _ => Err(self.error(format!(
                "{key} is {value:?}, but the vocabulary has that token at id {expected}"
            ))),
        }
    }
}
