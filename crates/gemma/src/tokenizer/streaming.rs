//! Turning generated ids into text one id at a time without splitting a
//! UTF-8 character: a character spelled by byte-fallback pieces (`<0xE2>`,
//! `<0x82>`, `<0xAC>`) comes out whole once its last byte arrives.

use super::vocab::SPACE_MARKER;
use super::{Tokenizer, TokenizerError};

/// Decodes ids as they are generated into text pieces that never end inside a UTF-8 character.
///
/// The pieces joined are what [`Tokenizer::decode`] gives for all the ids when they spell valid
/// UTF-8; bytes that can never complete a character come out as U+FFFD.
#[derive(Debug)]
pub struct StreamingDecoder<'a> {
    tokenizer: &'a Tokenizer,
    /// Bytes of a character whose last bytes have not arrived yet.
    pending: Vec<u8>,
}

impl<'a> StreamingDecoder<'a> {
    /// A decoder with nothing pending.
    pub fn new(tokenizer: &'a Tokenizer) -> StreamingDecoder<'a> {
        StreamingDecoder {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Adds one id and returns the text it completes (empty while a character is incomplete).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let piece = self
            .tokenizer
            .id_to_token(id)
            .ok_or(TokenizerError::UnknownId {
                id,
                vocab_size: self.tokenizer.vocab_size(),
            })?;
        match byte_fallback_value(&piece) {
            Some(byte) => self.pending.push(byte),
            None => self
                .pending
                .extend_from_slice(piece.replace(SPACE_MARKER, " ").as_bytes()),
        }
        Ok(self.take_complete())
    }

    /// Returns what is still pending (an unfinished character becomes U+FFFD) and clears it.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }

    /// Takes the pending bytes up to the last complete character, turning bytes that can never
    /// be part of a character into U+FFFD.
    fn take_complete(&mut self) -> String {
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(all) => {
                    text.push_str(all);
                    self.pending.clear();
                    return text;
                }
                Err(error) => {
                    let valid = error.valid_up_to();
                    text.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match error.error_len() {
                        None => {
                            self.pending.drain(..valid);
                            return text;
                        }
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }
}

/// The byte a byte-fallback piece `<0xAB>` stands for.
fn byte_fallback_value(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
