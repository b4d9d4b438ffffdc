//! A vocabulary's pieces by id in one buffer: all that decoding needs,
//! without the encoder's tables (the `tokenizers` pipeline of Gemma 3's
//! 262,144 pieces holds about 72 MB; this about 3 MB).

/// The pieces, as written in the vocabulary (`▁` for spaces), by id.
#[derive(Debug)]
pub(super) struct Pieces {
    text: String,
    /// The end of piece `i` in `text` (its start is the previous end).
    ends: Vec<u32>,
}

impl Pieces {
    /// The pieces listed in id order.
    pub(super) fn new(tokens: &[String]) -> Pieces {
        let mut text = String::with_capacity(tokens.iter().map(String::len).sum());
        let mut ends = Vec::with_capacity(tokens.len());
        for token in tokens {
            text.push_str(token);
            ends.push(text.len() as u32);
        }
        Pieces { text, ends }
    }

    /// The piece with id `id`.
    pub(super) fn get(&self, id: u32) -> Option<&str> {
        let i = id as usize;
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.text.get(start..end)
    }

    /// The id of the piece `piece` (the first, if listed twice), by a scan.
    pub(super) fn id(&self, piece: &str) -> Option<u32> {
        (0..self.ends.len() as u32).find(|&id| self.get(id) == Some(piece))
    }
}

#[cfg(test)]
mod tests {
    use super::Pieces;

    #[test]
    fn pieces_come_back_by_id_and_ids_by_piece() {
        let tokens: Vec<String> = ["<pad>", "", "▁the", "é", "<0x0A>"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let pieces = Pieces::new(&tokens);
        for (id, token) in tokens.iter().enumerate() {
            assert_eq!(pieces.get(id as u32), Some(token.as_str()));
        }
        assert_eq!(pieces.get(5), None);
        assert_eq!(pieces.id("▁the"), Some(2));
        assert_eq!(pieces.id("é"), Some(3));
        assert_eq!(pieces.id("the"), None);
    }
}
