//! How a cache stores key or value vectors: floats of one dtype, MLX
//! affine quantization with per-group scales and biases, ggml's 32-value
//! blocks ([`super::block`]), or TurboQuant ([`super::turbo`]).

use mlx_core::{concatenate, quantize, zeros, Array, Dtype, QuantizedArray};

use super::block::{self, BlockArray};
use super::error::CacheError;
use super::turbo::{self, TurboArray, TURBO_GROUP};
use crate::quant::{GgufDtype, BLOCK_VALUES};

/// The storage format of keys or of values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvFormat {
    /// Unquantized; `None` keeps the model's compute dtype, `Some` casts on insert.
    Float(Option<Dtype>),
    /// MLX affine quantization with `bits` per value in groups of `group_size`.
    Quantized {
        /// 2, 3, 4, 5, 6 or 8.
        bits: i32,
        /// 32, 64 or 128.
        group_size: i32,
    },
    /// TurboQuant with `bits` per value (2, 3 or 4), in groups of 128 values
    /// with one float16 norm each, decoded in the rotated domain.
    Turbo {
        /// 2, 3 or 4.
        bits: i32,
    },
    /// One of ggml's 32-value block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1),
    /// byte for byte as llama.cpp stores its KV cache.
    Block(GgufDtype),
}

impl KvFormat {
    /// Checks that the format is one MLX can store for vectors of `dim` values.
    pub fn validate(&self, dim: i32) -> Result<(), CacheError> {
        if let KvFormat::Turbo { bits } = *self {
            return turbo::validate(bits, dim);
        }
        if let KvFormat::Block(dtype) = *self {
            return block::validate(dtype, dim);
        }
        if let KvFormat::Quantized { bits, group_size } = *self {
            if ![2, 3, 4, 5, 6, 8].contains(&bits) {
                return Err(CacheError::Format(format!(
                    "{bits}-bit KV quantization is not supported (accepted: 2, 3, 4, 5, 6, 8)"
                )));
            }
            if ![32, 64, 128].contains(&group_size) {
                return Err(CacheError::Format(format!(
                    "KV group size {group_size} is not supported (accepted: 32, 64, 128)"
                )));
            }
            if dim % group_size != 0 {
                return Err(CacheError::Format(format!(
                    "head dimension {dim} is not a multiple of the KV group size {group_size}"
                )));
            }
        }
        Ok(())
    }

    /// Bytes one stored vector of `dim` values takes: `dim·bits/8` packed
    /// bytes plus `2·dim/group` scales and biases in `compute` for an affine
    /// format; `dim·bits/8` packed bytes plus a float16 norm per 128 values
    /// for TurboQuant; `dim / 32` blocks of a block format; `dim` values of
    /// the stored dtype otherwise.
    pub fn bytes_per_vector(&self, dim: usize, compute: Dtype) -> usize {
        match *self {
            KvFormat::Float(dtype) => dim * dtype.unwrap_or(compute).size_bytes(),
            KvFormat::Quantized { bits, group_size } => {
                dim * bits as usize / 8 + 2 * (dim / group_size as usize) * compute.size_bytes()
            }
            KvFormat::Turbo { bits } => {
                let groups = dim / TURBO_GROUP as usize;
                groups * (turbo::packed_group_bytes(bits) as usize + Dtype::Float16.size_bytes())
            }
            KvFormat::Block(dtype) => dim / BLOCK_VALUES * dtype.type_size() as usize,
        }
    }

    /// Whether vectors are stored as plain floats.
    pub fn is_float(&self) -> bool {
        matches!(self, KvFormat::Float(_))
    }

    /// An all-zero store of `positions` vectors of batch 1 shaped by `spec`.
    pub fn zeros(&self, spec: VectorSpec, positions: i32) -> Result<KvStore, CacheError> {
        let one = zeros(&[1, spec.heads, 1, spec.dim], spec.dtype)?;
        KvStore::zeros_like(&KvStore::encode(&one, *self)?, positions)
    }
}

/// Vectors of one kind (keys or values) laid out as `[B, heads, positions, dim]`
/// in one of the [`KvFormat`]s. Quantized stores hold three arrays with the
/// same leading axes; every method acts on the positions axis (2).
#[derive(Debug, Clone)]
pub enum KvStore {
    /// Unquantized vectors.
    Float(Array),
    /// Quantized vectors.
    Quantized(QuantizedArray),
    /// TurboQuant vectors (rotated domain).
    Turbo(TurboArray),
    /// Vectors in ggml blocks.
    Block(BlockArray),
}

impl KvStore {
    /// Turns freshly computed vectors `[B, H, n, D]` into the format.
    pub fn encode(x: &Array, format: KvFormat) -> Result<KvStore, CacheError> {
        Ok(match format {
            KvFormat::Float(None) => KvStore::Float(x.clone()),
            KvFormat::Float(Some(dtype)) => KvStore::Float(if x.dtype() == dtype {
                x.clone()
            } else {
                x.astype(dtype)?
            }),
            KvFormat::Quantized { bits, group_size } => {
                KvStore::Quantized(quantize(x, group_size, bits)?)
            }
            KvFormat::Turbo { bits } => KvStore::Turbo(TurboArray::encode(x, bits)?),
            KvFormat::Block(dtype) => KvStore::Block(BlockArray::encode(x, dtype)?),
        })
    }

    /// The store re-encoded in `format` (used when a cache that kept its
    /// first tokens unquantized starts quantizing). A compressed store stays
    /// as it is.
    pub fn convert(&self, format: KvFormat) -> Result<KvStore, CacheError> {
        match self {
            KvStore::Float(a) => KvStore::encode(a, format),
            KvStore::Quantized(_) | KvStore::Turbo(_) | KvStore::Block(_) => Ok(self.clone()),
        }
    }

    /// An all-zero store of `positions` vectors shaped like `like`.
    pub fn zeros_like(like: &KvStore, positions: i32) -> Result<KvStore, CacheError> {
        like.map(|a| {
            let mut shape = a.shape();
            shape[2] = positions;
            zeros(&shape, a.dtype())
        })
    }

    /// Applies `f` to every array of the store.
    pub(crate) fn map(
        &self,
        f: impl Fn(&Array) -> mlx_core::Result<Array>,
    ) -> Result<KvStore, CacheError> {
        Ok(match self {
            KvStore::Float(a) => KvStore::Float(f(a)?),
            KvStore::Quantized(q) => KvStore::Quantized(QuantizedArray {
                packed: f(&q.packed)?,
                scales: f(&q.scales)?,
                biases: f(&q.biases)?,
                group_size: q.group_size,
                bits: q.bits,
            }),
            KvStore::Turbo(t) => KvStore::Turbo(TurboArray {
                packed: f(&t.packed)?,
                norms: f(&t.norms)?,
                bits: t.bits,
            }),
            KvStore::Block(b) => KvStore::Block(BlockArray {
                bytes: f(&b.bytes)?,
                dtype: b.dtype,
            }),
        })
    }

    /// Applies `f` to matching arrays of two stores of the same format.
    fn zip(
        &self,
        other: &KvStore,
        f: impl Fn(&Array, &Array) -> mlx_core::Result<Array>,
    ) -> Result<KvStore, CacheError> {
        Ok(match (self, other) {
            (KvStore::Float(a), KvStore::Float(b)) => KvStore::Float(f(a, b)?),
            (KvStore::Quantized(a), KvStore::Quantized(b)) => KvStore::Quantized(QuantizedArray {
                packed: f(&a.packed, &b.packed)?,
                scales: f(&a.scales, &b.scales)?,
                biases: f(&a.biases, &b.biases)?,
                group_size: a.group_size,
                bits: a.bits,
            }),
            (KvStore::Turbo(a), KvStore::Turbo(b)) => KvStore::Turbo(TurboArray {
                packed: f(&a.packed, &b.packed)?,
                norms: f(&a.norms, &b.norms)?,
                bits: a.bits,
            }),
            (KvStore::Block(a), KvStore::Block(b)) if a.dtype == b.dtype => {
                KvStore::Block(BlockArray {
                    bytes: f(&a.bytes, &b.bytes)?,
                    dtype: a.dtype,
                })
            }
            _ => {
                return Err(CacheError::Format(
                    "mixing stores of different formats".into(),
                ))
            }
        })
    }

    /// The format the store holds (floats as their dtype).
    pub fn format(&self) -> KvFormat {
        match self {
            KvStore::Float(a) => KvFormat::Float(Some(a.dtype())),
            KvStore::Quantized(q) => KvFormat::Quantized {
                bits: q.bits,
                group_size: q.group_size,
            },
            KvStore::Turbo(t) => KvFormat::Turbo { bits: t.bits },
            KvStore::Block(b) => KvFormat::Block(b.dtype),
        }
    }

    /// The store that [`KvStore::arrays`] flattened at the head of `arrays`,
    /// for vectors of `dim` values, and how many arrays it took: one float
    /// array; uint32 packed values, scales and biases (affine); uint8
    /// packed indices and float16 norms (TurboQuant); or one int8 or int16
    /// array of ggml blocks, whose dtype and size per vector name the block
    /// format (see [`block::dtype_of`]).
    pub fn from_arrays(arrays: &[Array], dim: i32) -> Result<(KvStore, usize), CacheError> {
        let missing = || CacheError::Format("too few arrays for a stored format".into());
        let first = arrays.first().ok_or_else(missing)?;
        Ok(match first.dtype() {
            Dtype::Uint32 => {
                let [packed, scales, biases] = arrays.get(..3).ok_or_else(missing)? else {
                    return Err(missing());
                };
                let store = KvStore::Quantized(QuantizedArray {
                    bits: packed.dim(-1)? * 32 / dim,
                    group_size: dim / scales.dim(-1)?,
                    packed: packed.clone(),
                    scales: scales.clone(),
                    biases: biases.clone(),
                });
                (store, 3)
            }
            Dtype::Uint8 => {
                let [packed, norms] = arrays.get(..2).ok_or_else(missing)? else {
                    return Err(missing());
                };
                let store = KvStore::Turbo(TurboArray {
                    bits: packed.dim(-1)? * 8 / dim,
                    packed: packed.clone(),
                    norms: norms.clone(),
                });
                (store, 2)
            }
            held @ (Dtype::Int8 | Dtype::Int16) => {
                let elements = first.dim(-1)?;
                let dtype = block::dtype_of(held, elements, dim).ok_or_else(|| {
                    CacheError::Format(format!(
                        "{elements} values of {held:?} per vector of {dim} values is no block format"
                    ))
                })?;
                let store = KvStore::Block(BlockArray {
                    bytes: first.clone(),
                    dtype,
                });
                (store, 1)
            }
            _ => (KvStore::Float(first.clone()), 1),
        })
    }

    /// The number of positions held.
    pub fn positions(&self) -> i32 {
        let shape = match self {
            KvStore::Float(a) => a.shape(),
            KvStore::Quantized(q) => q.packed.shape(),
            KvStore::Turbo(t) => t.packed.shape(),
            KvStore::Block(b) => b.bytes.shape(),
        };
        shape.get(2).copied().unwrap_or(0)
    }

    /// Positions `start..stop`.
    pub fn slice(&self, start: i32, stop: i32) -> Result<KvStore, CacheError> {
        self.map(|a| {
            let shape = a.shape();
            a.slice(
                &[0, 0, start, 0],
                &[shape[0], shape[1], stop, shape[3]],
                &[1, 1, 1, 1],
            )
        })
    }

    /// The store with `update`'s positions written from `start` on.
    pub fn write(&self, update: &KvStore, start: i32) -> Result<KvStore, CacheError> {
        let n = update.positions();
        self.zip(update, |a, u| {
            let shape = a.shape();
            a.slice_update(
                u,
                &[0, 0, start, 0],
                &[shape[0], shape[1], start + n, shape[3]],
                &[1, 1, 1, 1],
            )
        })
    }

    /// The store with `update`'s positions written from the position held in
    /// `start` (an int32 array `[1]`) on.
    pub fn write_dynamic(&self, update: &KvStore, start: &Array) -> Result<KvStore, CacheError> {
        self.zip(update, |a, u| a.slice_update_dynamic(u, start, &[2]))
    }

    /// The stores joined along the positions axis.
    pub fn concat(parts: &[&KvStore]) -> Result<KvStore, CacheError> {
        let (first, rest) = parts
            .split_first()
            .ok_or_else(|| CacheError::Format("concatenating no stores".into()))?;
        let mut out = (*first).clone();
        for part in rest {
            out = out.zip(part, |a, b| concatenate(&[a, b], 2))?;
        }
        Ok(out)
    }

    /// Bytes of the arrays held.
    pub fn nbytes(&self) -> usize {
        match self {
            KvStore::Float(a) => a.nbytes(),
            KvStore::Quantized(q) => q.nbytes(),
            KvStore::Turbo(t) => t.nbytes(),
            KvStore::Block(b) => b.nbytes(),
        }
    }

    /// The vectors as floats in their original domain: a float store as it
    /// is, a compressed one decoded into `dtype` (dequantized, or decoded and
    /// rotated back).
    pub fn decoded(&self, dtype: Dtype) -> Result<Array, CacheError> {
        match self {
            KvStore::Float(a) => Ok(a.clone()),
            KvStore::Quantized(q) => Ok(q.dequantize()?.astype(dtype)?),
            KvStore::Turbo(t) => t.decode(dtype),
            KvStore::Block(b) => b.decode(dtype),
        }
    }

    /// The arrays held.
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            KvStore::Float(a) => vec![a],
            KvStore::Quantized(q) => vec![&q.packed, &q.scales, &q.biases],
            KvStore::Turbo(t) => vec![&t.packed, &t.norms],
            KvStore::Block(b) => vec![&b.bytes],
        }
    }
}

/// The shape and dtype of key and value buffers a cache creates when it has
/// none yet.
#[derive(Debug, Clone, Copy)]
pub struct VectorSpec {
    /// Key/value heads.
    pub heads: i32,
    /// Features per head.
    pub dim: i32,
    /// The compute dtype (used where the format keeps it).
    pub dtype: Dtype,
}
