//! The tokens read back, turned into the generation's ids and text: stop
//! tokens and stop strings end it, and text that may begin a stop string is
//! held back from the stream until it cannot.

use gemma::tokenizer::{StreamingDecoder, Tokenizer};

use super::TokenEvent;
use crate::error::GenerateError;
use crate::options::FinishReason;

/// The generated ids and text so far, and what is already streamed.
pub struct Output<'t, 's> {
    /// Detokenizes as tokens arrive (`None` for a model without tokenizer).
    decoder: Option<StreamingDecoder<'t>>,
    /// Token ids that end the generation.
    stop_ids: Vec<u32>,
    /// Text that ends the generation.
    stop_strings: &'s [String],
    /// The generated text.
    text: String,
    /// Bytes of `text` handed to the callback; the rest may begin a stop string.
    emitted: usize,
    /// The generated token ids.
    ids: Vec<u32>,
}

impl<'t, 's> Output<'t, 's> {
    /// Nothing generated yet.
    pub fn new(
        tokenizer: Option<&'t Tokenizer>,
        stop_ids: Vec<u32>,
        stop_strings: &'s [String],
    ) -> Output<'t, 's> {
        Output {
            decoder: tokenizer.map(StreamingDecoder::new),
            stop_ids,
            stop_strings,
            text: String::new(),
            emitted: 0,
            ids: Vec::new(),
        }
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.ids.len()
    }

    /// Adds token `id` and hands it to `on_token` with the text it
    /// completes; returns why the generation ends if this token ends it.
    pub fn push(
        &mut self,
        id: u32,
        on_token: &mut dyn FnMut(&TokenEvent<'_>),
    ) -> Result<Option<FinishReason>, GenerateError> {
        let index = self.ids.len();
        self.ids.push(id);
        if self.stop_ids.contains(&id) {
            on_token(&TokenEvent {
                index,
                id,
                text: "",
            });
            return Ok(Some(FinishReason::Stop));
        }
        let piece = match self.decoder.as_mut() {
            Some(decoder) => decoder.push(id)?,
            None => String::new(),
        };
        self.text.push_str(&piece);
        if let Some(cut) = stop_string_end(&self.text, self.stop_strings) {
            self.text.truncate(cut);
            on_token(&TokenEvent {
                index,
                id,
                text: self.text.get(self.emitted..).unwrap_or(""),
            });
            return Ok(Some(FinishReason::StopString));
        }
        let safe = self.text.len() - held_back(&self.text, self.stop_strings);
        on_token(&TokenEvent {
            index,
            id,
            text: self.text.get(self.emitted..safe).unwrap_or(""),
        });
        self.emitted = self.emitted.max(safe);
        Ok(None)
    }

    /// Ends the text (unless a stop string cut it): whatever the decoder
    /// still holds and the text held back go to `on_token` with the last
    /// token. Returns the text and the token ids.
    pub fn finish(
        mut self,
        finish: FinishReason,
        on_token: &mut dyn FnMut(&TokenEvent<'_>),
    ) -> (String, Vec<u32>) {
        if finish != FinishReason::StopString {
            if let Some(decoder) = self.decoder.as_mut() {
                self.text.push_str(&decoder.finish());
                let rest = self.text.get(self.emitted..).unwrap_or("");
                if let (false, Some(&id)) = (rest.is_empty(), self.ids.last()) {
                    on_token(&TokenEvent {
                        index: self.ids.len() - 1,
                        id,
                        text: rest,
                    });
                }
            }
        }
        (self.text, self.ids)
    }
}

/// The length of the longest end of `text` that could begin one of `stops`
/// (a proper prefix of a stop string): text not to stream yet.
fn held_back(text: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .filter_map(|s| {
            (1..s.len())
                .rev()
                .find(|&k| s.is_char_boundary(k) && text.ends_with(&s[..k]))
        })
        .max()
        .unwrap_or(0)
}

/// Where `text` must be cut if it contains one of `stops` (the earliest one).
fn stop_string_end(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}

#[cfg(test)]
mod tests {
    use super::{held_back, stop_string_end};

    #[test]
    fn stop_strings_cut_at_the_earliest_match() {
        let stops = vec!["\n\n".to_string(), "END".to_string()];
        assert_eq!(stop_string_end("abc END x\n\n", &stops), Some(4));
        assert_eq!(stop_string_end("abc", &stops), None);
        assert_eq!(stop_string_end("abc", &[String::new()]), None);
    }

    #[test]
    fn text_that_may_begin_a_stop_string_is_held_back() {
        let stops = vec!["France. It".to_string(), "ß!".to_string()];
        assert_eq!(held_back("of France", &stops), 6);
        assert_eq!(held_back("of France.", &stops), 7);
        assert_eq!(held_back("of France!", &stops), 0);
        assert_eq!(held_back("Straße", &stops), 0);
        assert_eq!(held_back("Straß", &stops), 2);
        assert_eq!(held_back("x", &[]), 0);
    }
}
