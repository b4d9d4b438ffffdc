//! Parsing of a GGUF header: magic, version, metadata and tensor infos.
//!
//! Every read is checked against the bytes that remain, and every count is
//! checked against the smallest size its items could take before anything is
//! allocated for them, so a damaged or hostile file yields a [`GgufProblem`]
//! and never a panic or a huge allocation.

use std::collections::{BTreeMap, HashSet};

use super::error::GgufProblem;
use super::value::GgufValue;
use crate::quant::GgufDtype;

/// Where one tensor lives in a GGUF file and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in GGUF order: `shape[0]` (ggml's `ne[0]`) varies fastest.
    pub shape: Vec<u64>,
    /// Element type.
    pub dtype: GgufDtype,
    /// Absolute offset of the data in the file.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    /// Number of elements (1 for a tensor without dimensions).
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// The shape of the same data as a row-major (MLX, numpy) array: the GGUF dimensions reversed.
    pub fn row_major_shape(&self) -> Vec<u64> {
        self.shape.iter().rev().copied().collect()
    }
}

/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions a ggml tensor can have.
const MAX_DIMS: u32 = 4;
/// The deepest array nesting accepted in metadata.
const MAX_ARRAY_DEPTH: usize = 8;
/// Smallest encoded size of one metadata key/value: key length, key type.
const MIN_KV_BYTES: u64 = 8 + 4;
/// Smallest encoded size of one tensor info: name length, dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// Everything a GGUF header says, with tensor offsets made absolute.
pub struct Header {
    /// The format version (2 or 3).
    pub version: u32,
    /// Metadata key/values.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensor infos in file order, validated against the file's length.
    pub tensors: Vec<GgufTensorInfo>,
    /// Alignment of tensor data.
    pub alignment: u64,
    /// Absolute offset where tensor data starts.
    pub data_offset: u64,
}

/// Parses and validates the header of a GGUF file held in `bytes`.
pub fn parse_header(bytes: &[u8]) -> Result<Header, GgufProblem> {
    let mut cur = Cursor { bytes, pos: 0 };
    let magic = cur.take(4, "the magic bytes")?;
    if magic != b"GGUF" {
        return Err(GgufProblem::BadMagic {
            found: magic.to_vec(),
        });
    }
    let version = cur.u32("the version")?;
    if version != 2 && version != 3 {
        return Err(GgufProblem::UnsupportedVersion(version));
    }
    let tensor_count = cur.u64("the tensor count")?;
    let kv_count = cur.u64("the metadata count")?;
    cur.check_count(kv_count, MIN_KV_BYTES, "the metadata count")?;

    let mut metadata = BTreeMap::new();
    for _ in 0..kv_count {
        let key = cur.string("a metadata key")?;
        let type_id = cur.u32(&format!("the type of metadata '{key}'"))?;
        let value = cur.value(&key, type_id, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(GgufProblem::DuplicateKey(key));
        }
    }
    let alignment = alignment(&metadata)?;

    cur.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, "the tensor count")?;
    let mut raw = Vec::new();
    let mut names = HashSet::new();
    for _ in 0..tensor_count {
        let info = cur.tensor_info()?;
        if !names.insert(info.name.clone()) {
            return Err(GgufProblem::DuplicateTensor(info.name));
        }
        raw.push(info);
    }

    let data_offset = align_up(cur.pos as u64, alignment);
    let file_len = bytes.len() as u64;
    let tensors = raw
        .into_iter()
        .map(|t| t.locate(data_offset, alignment, file_len))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// The file's alignment: `general.alignment`, a power of two, or the default.
fn alignment(metadata: &BTreeMap<String, GgufValue>) -> Result<u64, GgufProblem> {
    let key = "general.alignment";
    match metadata.get(key) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(GgufValue::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(other) => Err(GgufProblem::BadMetadata {
            key: key.to_string(),
            found: format!("{other:?}"),
            expected: "a u32 power of two".to_string(),
        }),
    }
}

/// Rounds `offset` up to a multiple of `alignment` (a power of two).
fn align_up(offset: u64, alignment: u64) -> u64 {
    offset.div_ceil(alignment) * alignment
}

/// A tensor info as stored: offset relative to the data section.
struct RawTensorInfo {
    name: String,
    shape: Vec<u64>,
    dtype: GgufDtype,
    relative_offset: u64,
    n_bytes: u64,
}

impl RawTensorInfo {
    /// Checks alignment and bounds, and makes the offset absolute.
    fn locate(
        self,
        data_offset: u64,
        alignment: u64,
        file_len: u64,
    ) -> Result<GgufTensorInfo, GgufProblem> {
        if !self.relative_offset.is_multiple_of(alignment) {
            return Err(GgufProblem::Misaligned {
                tensor: self.name,
                offset: self.relative_offset,
                alignment,
            });
        }
        let offset = data_offset.saturating_add(self.relative_offset);
        let fits = offset
            .checked_add(self.n_bytes)
            .is_some_and(|end| end <= file_len);
        if !fits {
            return Err(GgufProblem::TensorPastEnd {
                tensor: self.name,
                offset,
                needed: self.n_bytes,
                left: file_len.saturating_sub(offset),
            });
        }
        Ok(GgufTensorInfo {
            name: self.name,
            shape: self.shape,
            dtype: self.dtype,
            offset,
            n_bytes: self.n_bytes,
        })
    }
}

/// A read position in the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// Bytes left from the current position.
    fn left(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    /// The next `n` bytes.
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufProblem> {
        let truncated = || GgufProblem::Truncated {
            what: what.to_string(),
            offset: self.pos as u64,
            needed: n,
            left: self.left(),
        };
        let n = usize::try_from(n).map_err(|_| truncated())?;
        let end = self.pos.checked_add(n).ok_or_else(truncated)?;
        let slice = self.bytes.get(self.pos..end).ok_or_else(truncated)?;
        self.pos = end;
        Ok(slice)
    }

    /// The next `N` bytes as an array.
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufProblem> {
        let slice = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufProblem> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufProblem> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Fails unless `count` items of at least `min_bytes` each fit in the rest of the file.
    fn check_count(&self, count: u64, min_bytes: u64, what: &str) -> Result<(), GgufProblem> {
        let max = self.left() / min_bytes;
        if count > max {
            return Err(GgufProblem::CountTooLarge {
                what: what.to_string(),
                count,
                offset: self.pos as u64,
                left: self.left(),
                max,
            });
        }
        Ok(())
    }

    /// A u64-length-prefixed UTF-8 string.
    fn string(&mut self, what: &str) -> Result<String, GgufProblem> {
        let len = self.u64(&format!("the length of {what}"))?;
        let start = self.pos as u64;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufProblem::BadUtf8 {
            what: what.to_string(),
            offset: start,
        })
    }

    /// A metadata value of type `type_id`, belonging to `key`.
    fn value(&mut self, key: &str, type_id: u32, depth: usize) -> Result<GgufValue, GgufProblem> {
        let what = format!("metadata '{key}'");
        Ok(match type_id {
            0 => GgufValue::U8(u8::from_le_bytes(self.array(&what)?)),
            1 => GgufValue::I8(i8::from_le_bytes(self.array(&what)?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(&what)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(&what)?)),
            4 => GgufValue::U32(u32::from_le_bytes(self.array(&what)?)),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(&what)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(&what)?)),
            7 => GgufValue::Bool(u8::from_le_bytes(self.array(&what)?) != 0),
            8 => GgufValue::String(self.string(&what)?),
            9 => self.array_value(key, depth)?,
            10 => GgufValue::U64(u64::from_le_bytes(self.array(&what)?)),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(&what)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(&what)?)),
            id => {
                return Err(GgufProblem::UnknownValueType {
                    key: key.to_string(),
                    id,
                })
            }
        })
    }

    /// An array value: element type, count, elements.
    fn array_value(&mut self, key: &str, depth: usize) -> Result<GgufValue, GgufProblem> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(GgufProblem::NestedTooDeep {
                key: key.to_string(),
                max: MAX_ARRAY_DEPTH,
            });
        }
        let elem_type = self.u32(&format!("the element type of metadata '{key}'"))?;
        let count = self.u64(&format!("the length of metadata '{key}'"))?;
        let min_bytes = match elem_type {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 4 + 8,
            id => {
                return Err(GgufProblem::UnknownValueType {
                    key: key.to_string(),
                    id,
                })
            }
        };
        self.check_count(count, min_bytes, &format!("the length of metadata '{key}'"))?;
        let mut items = Vec::with_capacity(count as usize);
        for _ in 0..count {
            items.push(self.value(key, elem_type, depth + 1)?);
        }
        Ok(GgufValue::Array(items))
    }

    /// One tensor info, with its shape checked against its type.
    fn tensor_info(&mut self) -> Result<RawTensorInfo, GgufProblem> {
        let name = self.string("a tensor name")?;
        let n_dims = self.u32(&format!("the dimension count of tensor '{name}'"))?;
        if n_dims > MAX_DIMS {
            return Err(GgufProblem::TooManyDims {
                tensor: name,
                n_dims,
                max: MAX_DIMS,
            });
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            shape.push(self.u64(&format!("the shape of tensor '{name}'"))?);
        }
        let type_id = self.u32(&format!("the type of tensor '{name}'"))?;
        let relative_offset = self.u64(&format!("the offset of tensor '{name}'"))?;
        let Some(dtype) = GgufDtype::from_id(type_id) else {
            return Err(GgufProblem::UnknownTensorType {
                tensor: name,
                id: type_id,
            });
        };
        let ne0 = shape.first().copied().unwrap_or(1);
        if !ne0.is_multiple_of(dtype.block_size()) {
            return Err(GgufProblem::PartialBlock {
                tensor: name,
                ne0,
                dtype,
                block_size: dtype.block_size(),
            });
        }
        let n_bytes = shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| i64::try_from(n).is_ok())
            .and_then(|n| (n / dtype.block_size()).checked_mul(dtype.type_size()));
        let Some(n_bytes) = n_bytes else {
            return Err(GgufProblem::ShapeOverflow {
                tensor: name,
                shape,
            });
        };
        Ok(RawTensorInfo {
            name,
            shape,
            dtype,
            relative_offset,
            n_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version-3 header with no metadata and one F32 tensor of `shape`.
    fn one_f32_tensor(shape: &[u64]) -> Vec<u8> {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes.extend_from_slice(&4u64.to_le_bytes());
        bytes.extend_from_slice(b"huge");
        bytes.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for d in shape {
            bytes.extend_from_slice(&d.to_le_bytes());
        }
        bytes.extend_from_slice(&GgufDtype::F32.id().to_le_bytes());
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes
    }

    #[test]
    fn a_one_tib_tensor_in_a_tiny_file_is_refused_before_any_allocation() {
        let bytes = one_f32_tensor(&[1 << 18, 1 << 20]);
        let Err(problem) = parse_header(&bytes) else {
            panic!("a 1 TiB tensor in {} bytes was accepted", bytes.len());
        };
        let GgufProblem::TensorPastEnd {
            ref tensor,
            offset,
            needed,
            left,
        } = problem
        else {
            panic!("expected TensorPastEnd, got {problem}");
        };
        assert_eq!(
            (tensor.as_str(), offset, needed, left),
            ("huge", 96, 1 << 40, 0)
        );
        assert_eq!(
            problem.to_string(),
            "tensor 'huge' needs 1099511627776 bytes at offset 96, the file has 0 left"
        );
    }
}
