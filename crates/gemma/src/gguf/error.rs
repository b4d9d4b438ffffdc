//! Errors of the GGUF reader.

use std::path::PathBuf;

use crate::quant::{DequantError, GgufDtype};

/// A failure to read a GGUF file; its message starts with the file's path.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct GgufError {
    /// The file being read.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: GgufProblem,
}

/// What went wrong while reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufProblem {
    /// The file could not be opened or mapped.
    #[error("cannot read the file: {0}")]
    Io(#[from] std::io::Error),
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: the magic bytes are {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found at offset 0.
        found: Vec<u8>,
    },
    /// The header's version is not 2 or 3.
    #[error("unsupported GGUF version {0} (this reader handles versions 2 and 3)")]
    UnsupportedVersion(u32),
    /// The file ends inside a header field.
    #[error("truncated: {what} needs {needed} bytes at offset {offset}, the file has {left} left")]
    Truncated {
        /// The field being read.
        what: String,
        /// Where it starts.
        offset: u64,
        /// Bytes it needs.
        needed: u64,
        /// Bytes left in the file from `offset`.
        left: u64,
    },
    /// A count in the header promises more items than the rest of the file can hold.
    #[error("{what} is {count}, but the {left} bytes left at offset {offset} hold at most {max}")]
    CountTooLarge {
        /// The count being read.
        what: String,
        /// Its value.
        count: u64,
        /// Where the counted items start.
        offset: u64,
        /// Bytes left from `offset`.
        left: u64,
        /// How many items fit, at their smallest size.
        max: u64,
    },
    /// A metadata value has a type id outside the GGUF specification.
    #[error("metadata '{key}' has unknown value type {id}")]
    UnknownValueType {
        /// The metadata key.
        key: String,
        /// The type id found.
        id: u32,
    },
    /// Arrays nest deeper than the reader allows.
    #[error("metadata '{key}' nests arrays deeper than {max} levels")]
    NestedTooDeep {
        /// The metadata key.
        key: String,
        /// The deepest nesting accepted.
        max: usize,
    },
    /// A string is not valid UTF-8.
    #[error("{what} at offset {offset} is not valid UTF-8")]
    BadUtf8 {
        /// The string being read.
        what: String,
        /// Where its bytes start.
        offset: u64,
    },
    /// The same metadata key appears twice.
    #[error("metadata key '{0}' appears more than once")]
    DuplicateKey(String),
    /// A metadata value has the wrong type or an invalid value.
    #[error("metadata '{key}' is {found}, expected {expected}")]
    BadMetadata {
        /// The metadata key.
        key: String,
        /// What was found.
        found: String,
        /// What the reader needs.
        expected: String,
    },
    /// A tensor's type id is not a ggml type this reader knows.
    #[error("tensor '{tensor}' has unknown type id {id}")]
    UnknownTensorType {
        /// The tensor name.
        tensor: String,
        /// The type id found.
        id: u32,
    },
    /// The same tensor name appears twice.
    #[error("tensor '{0}' appears more than once")]
    DuplicateTensor(String),
    /// A tensor has more dimensions than ggml allows.
    #[error("tensor '{tensor}' has {n_dims} dimensions, at most {max} are allowed")]
    TooManyDims {
        /// The tensor name.
        tensor: String,
        /// Its dimension count.
        n_dims: u32,
        /// ggml's limit.
        max: u32,
    },
    /// A tensor's element or byte count does not fit 64 bits.
    #[error("tensor '{tensor}' with shape {shape:?} is too large")]
    ShapeOverflow {
        /// The tensor name.
        tensor: String,
        /// Its shape (GGUF order).
        shape: Vec<u64>,
    },
    /// A tensor's rows do not split into whole blocks.
    #[error("tensor '{tensor}': first dimension {ne0} is not a multiple of the {dtype} block size {block_size}")]
    PartialBlock {
        /// The tensor name.
        tensor: String,
        /// The length of its first (fastest-varying) dimension.
        ne0: u64,
        /// Its type.
        dtype: GgufDtype,
        /// Elements per block of that type.
        block_size: u64,
    },
    /// A tensor's offset is not a multiple of the file's alignment.
    #[error("tensor '{tensor}' has offset {offset}, not a multiple of the alignment {alignment}")]
    Misaligned {
        /// The tensor name.
        tensor: String,
        /// Its offset from the data section's start.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's data reaches past the end of the file.
    #[error("tensor '{tensor}' needs {needed} bytes at offset {offset}, the file has {left} left")]
    TensorPastEnd {
        /// The tensor name.
        tensor: String,
        /// Its absolute offset in the file.
        offset: u64,
        /// Its size in bytes.
        needed: u64,
        /// Bytes left from its offset (0 when the offset itself is past the end).
        left: u64,
    },
    /// No tensor has the requested name.
    #[error("no tensor named '{0}'")]
    NoSuchTensor(String),
    /// The tensor could not be converted to f32.
    #[error("tensor '{tensor}': {source}")]
    Dequantize {
        /// The tensor name.
        tensor: String,
        /// Why.
        source: DequantError,
    },
}
