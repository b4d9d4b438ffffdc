//! A small GGUF writer for tests: builds valid files, and invalid ones on purpose.

#![allow(dead_code)] // each test binary uses a different part of this module

use std::io::Write;

use gemma::gguf::{GgufError, GgufFile, GgufValue};

/// One metadata entry: a well-formed value, or bytes written as they are
/// (key, type and value already encoded).
pub enum Entry {
    Value(String, GgufValue),
    Raw(Vec<u8>),
}

/// One tensor info plus its data; nothing is checked, so it can lie.
pub struct Tensor {
    pub name: String,
    pub shape: Vec<u64>,
    pub type_id: u32,
    /// Offset relative to the data section; `None` places it after the previous tensor.
    pub offset: Option<u64>,
    pub data: Vec<u8>,
}

/// A GGUF file under construction.
pub struct Builder {
    pub version: u32,
    pub entries: Vec<Entry>,
    pub tensors: Vec<Tensor>,
    /// Alignment used to lay out the data (write `general.alignment` yourself to change the file's).
    pub alignment: u64,
    /// Written instead of the real tensor count when set.
    pub tensor_count: Option<u64>,
    /// Written instead of the real metadata count when set.
    pub kv_count: Option<u64>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            version: 3,
            entries: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
            tensor_count: None,
            kv_count: None,
        }
    }
}

impl Builder {
    pub fn meta(mut self, key: &str, value: GgufValue) -> Self {
        self.entries.push(Entry::Value(key.to_string(), value));
        self
    }

    pub fn tensor(mut self, name: &str, shape: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors.push(Tensor {
            name: name.to_string(),
            shape: shape.to_vec(),
            type_id,
            offset: None,
            data,
        });
        self
    }

    pub fn build(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        let tensor_count = self.tensor_count.unwrap_or(self.tensors.len() as u64);
        let kv_count = self.kv_count.unwrap_or(self.entries.len() as u64);
        out.extend_from_slice(&tensor_count.to_le_bytes());
        out.extend_from_slice(&kv_count.to_le_bytes());
        for entry in &self.entries {
            match entry {
                Entry::Value(key, value) => {
                    put_string(&mut out, key);
                    out.extend_from_slice(&type_id(value).to_le_bytes());
                    put_value(&mut out, value);
                }
                Entry::Raw(bytes) => out.extend_from_slice(bytes),
            }
        }
        let mut next = 0u64;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            let offset = t.offset.unwrap_or(next);
            offsets.push(offset);
            next = align(offset + t.data.len() as u64, self.alignment);
            put_string(&mut out, &t.name);
            out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.type_id.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        let data_start = align(out.len() as u64, self.alignment);
        for (t, offset) in self.tensors.iter().zip(offsets) {
            let at = (data_start + offset) as usize;
            if out.len() < at + t.data.len() {
                out.resize(at + t.data.len(), 0);
            }
            out[at..at + t.data.len()].copy_from_slice(&t.data);
        }
        out
    }
}

pub fn align(offset: u64, alignment: u64) -> u64 {
    offset.div_ceil(alignment) * alignment
}

pub fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The GGUF type id of a value.
pub fn type_id(value: &GgufValue) -> u32 {
    match value {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

/// Encodes a value without its type id. Arrays take their element type from
/// their first element (u8 when empty).
pub fn put_value(out: &mut Vec<u8>, value: &GgufValue) {
    match value {
        GgufValue::U8(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::Bool(v) => out.push(u8::from(*v)),
        GgufValue::String(s) => put_string(out, s),
        GgufValue::Array(items) => {
            let elem = items.first().map(type_id).unwrap_or(0);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}

/// A temporary file holding `bytes`, and the result of opening it.
pub fn open_bytes(name: &str, bytes: &[u8]) -> (tempfile::TempDir, Result<GgufFile, GgufError>) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let path = dir.path().join(name);
    let mut file = std::fs::File::create(&path).expect("create the test file");
    file.write_all(bytes).expect("write the test file");
    drop(file);
    let opened = GgufFile::open(&path);
    (dir, opened)
}

/// Opens `bytes` and returns the error, failing the test if opening succeeds.
pub fn open_err(name: &str, bytes: &[u8]) -> GgufError {
    match open_bytes(name, bytes).1 {
        Ok(_) => panic!("{name}: opening succeeded, expected an error"),
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains(name),
                "the error message does not name the file: {message}"
            );
            e
        }
    }
}

/// The default model: `$GEMMA_MLX_MODEL` or `<workspace>/target/model/gemma-3-270m-q4_k_m.gguf`.
pub fn default_model_path() -> std::path::PathBuf {
    std::env::var_os("GEMMA_MLX_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/model/gemma-3-270m-q4_k_m.gguf")
        })
}
