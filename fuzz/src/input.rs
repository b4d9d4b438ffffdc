//! Splitting one fuzz input into fields: bytes taken from the front, each
//! read giving a default when the input has run out, so every input is
//! usable.

/// A read position in a fuzz input.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    bytes: &'a [u8],
}

impl<'a> Input<'a> {
    /// A cursor at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Input<'a> {
        Input { bytes }
    }

    /// The next byte, or 0 when none is left.
    pub fn byte(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&first, rest)) => {
                self.bytes = rest;
                first
            }
            None => 0,
        }
    }

    /// The next two bytes as a little-endian u16 (missing bytes read as 0).
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    /// The next `n` bytes, or fewer when fewer are left.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.bytes.split_at(n.min(self.bytes.len()));
        self.bytes = rest;
        head
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        self.take(self.bytes.len())
    }
}

/// `bytes` split at every occurrence of `separator` (which no part contains).
pub fn split(bytes: &[u8], separator: u8) -> impl Iterator<Item = &[u8]> {
    bytes.split(move |&b| b == separator)
}
