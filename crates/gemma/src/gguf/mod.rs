//! Reading GGUF files (llama.cpp's format): metadata, tensor infos and tensor
//! data, memory-mapped, with dequantization to f32.
//!
//! [`GgufFile::open`] maps the file and validates the whole header before
//! returning: every tensor's type is known, its rows hold whole blocks, its
//! offset is aligned and its bytes lie inside the file. After that,
//! [`GgufFile::tensor_bytes`] is a plain slice of the mapping.
//!
//! # Shapes
//!
//! GGUF lists dimensions fastest-varying first (ggml's `ne[0]`, `ne[1]`, ...).
//! A row-major (MLX, numpy) array of the same data has the dimensions in
//! reverse: a GGUF `[640, 262144]` embedding is a `[262144, 640]` row-major
//! matrix, one 640-element row per token. [`GgufTensorInfo::row_major_shape`]
//! does the reversal.

mod error;
mod reader;
mod value;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::quant::dequantize;
pub use error::{GgufError, GgufProblem};
pub use reader::{GgufTensorInfo, DEFAULT_ALIGNMENT};
pub use value::GgufValue;

/// An open, validated, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl GgufFile {
    /// Maps the file at `path` and parses and validates its header.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let error = |problem| GgufError {
            path: path.to_path_buf(),
            problem,
        };
        let file = File::open(path).map_err(|e| error(GgufProblem::Io(e)))?;
        // SAFETY: the mapping is read-only and lives as long as `GgufFile`.
        // Like every reader of mapped files, we rely on nobody truncating or
        // rewriting the file while it is open.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| error(GgufProblem::Io(e)))?;
        let header = reader::parse_header(&mmap).map_err(error)?;
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            path: path.to_path_buf(),
            mmap,
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            by_name,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data in bytes.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset where the tensor data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The info of the tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// The raw bytes of a tensor of this file (bounds were checked at open).
    /// An info that does not belong to this file and points outside it gives an empty slice.
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> &[u8] {
        usize::try_from(info.offset)
            .ok()
            .zip(usize::try_from(info.n_bytes).ok())
            .and_then(|(start, len)| self.mmap.get(start..start.checked_add(len)?))
            .unwrap_or_default()
    }

    /// Reads a tensor's bytes from the file into `buf` (exactly their
    /// length) through the file, not the map: the pages the map would touch
    /// stay out of the process's resident memory (for tensors copied into
    /// arrays).
    pub fn read_tensor_into(&self, info: &GgufTensorInfo, buf: &mut [u8]) -> Result<(), GgufError> {
        let error = |problem| GgufError {
            path: self.path.clone(),
            problem,
        };
        if buf.len() != self.tensor_bytes(info).len() {
            return Err(error(GgufProblem::Io(std::io::Error::other(format!(
                "tensor '{}' holds {} bytes, not {}",
                info.name,
                self.tensor_bytes(info).len(),
                buf.len()
            )))));
        }
        let mut file = File::open(&self.path).map_err(|e| error(GgufProblem::Io(e)))?;
        file.seek(SeekFrom::Start(info.offset))
            .and_then(|_| file.read_exact(buf))
            .map_err(|e| error(GgufProblem::Io(e)))
    }

    /// The tensor called `name` converted to f32, in storage order (see the module docs
    /// for the shape). Runs in parallel over blocks.
    pub fn dequantize_f32(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let error = |problem| GgufError {
            path: self.path.clone(),
            problem,
        };
        let info = self
            .tensor(name)
            .ok_or_else(|| error(GgufProblem::NoSuchTensor(name.to_string())))?;
        dequantize(info.dtype, self.tensor_bytes(info)).map_err(|source| {
            error(GgufProblem::Dequantize {
                tensor: name.to_string(),
                source,
            })
        })
    }
}
