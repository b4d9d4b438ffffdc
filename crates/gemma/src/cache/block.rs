//! Vectors stored in ggml's 32-value block formats, the KV-cache types of
//! llama.cpp (`q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`, `iq4_nl`): each
//! block's bytes are those ggml's reference quantizer writes
//! ([`crate::quant::quantize_into`]), decoded as ggml decodes them
//! ([`crate::quant::dequantize_into`]).
//!
//! The blocks of a vector lie one after another in an integer array whose
//! dtype no other store uses, so that a store flattened into arrays still
//! names its format (see [`super::KvStore::from_arrays`]): int8 for the
//! linear formats, told apart by their bytes per vector, and int16 for
//! `iq4_nl`, whose blocks are as long as `q4_0`'s. Encoding and decoding
//! are kernels of ours on either device: on the CPU the Rust quantizers
//! and decoders, on the GPU their CUDA twins ([`KV_BLOCKS_CUDA`], a thread
//! per block), which write the same bytes and read back the same values.
//! The GPU's fused layer and decode attention kernels read blocks in
//! registers (`crate::cuda`'s stored format 3); prefill chunks attend over
//! the decoded vectors.

use std::sync::{Arc, OnceLock};

use mlx_core::cpu_kernel::{cpu_kernel, floats, floats_mut, CpuKernelFn};
use mlx_core::device::{default_device, Device};
use mlx_core::kernel::{CudaKernel, Launch, OutputSpec, TemplateArg};
use mlx_core::{Array, Dtype};

use super::error::CacheError;
use crate::quant::{
    dequantize_into, kv_block_type, quantize_into, GgufDtype, BLOCK_VALUES, KV_BLOCKS_CUDA,
    QUANTIZABLE,
};

/// Threads per block of the GPU codecs.
const THREADS: i32 = 128;

/// The dtype of the array holding `dtype`'s blocks.
pub fn carrier(dtype: GgufDtype) -> Dtype {
    if dtype == GgufDtype::IQ4_NL {
        Dtype::Int16
    } else {
        Dtype::Int8
    }
}

/// Vectors in one of ggml's 32-value block formats, with the leading axes
/// of the vectors they stand for.
#[derive(Debug, Clone)]
pub struct BlockArray {
    /// `[..., dim / 32 · type_size / carrier size]` in [`carrier`]'s dtype:
    /// each vector's blocks, ggml's bytes.
    pub bytes: Array,
    /// The block format.
    pub dtype: GgufDtype,
}

/// Checks that `dtype` is a block format a cache can store, for vectors of
/// `dim` values.
pub fn validate(dtype: GgufDtype, dim: i32) -> Result<(), CacheError> {
    if !QUANTIZABLE.contains(&dtype) {
        return Err(CacheError::Format(format!(
            "{dtype} is not a KV block format (accepted: {})",
            QUANTIZABLE.map(|t| t.to_string()).join(", ")
        )));
    }
    if dim % BLOCK_VALUES as i32 != 0 {
        return Err(CacheError::Format(format!(
            "head dimension {dim} is not a multiple of the {BLOCK_VALUES} values of a {dtype} block"
        )));
    }
    Ok(())
}

/// The block format held in `elements` values of dtype `held` per vector
/// of `dim` values (the linear formats' type sizes differ; `iq4_nl` has a
/// carrier of its own).
pub fn dtype_of(held: Dtype, elements: i32, dim: i32) -> Option<GgufDtype> {
    let blocks = dim / BLOCK_VALUES as i32;
    QUANTIZABLE.into_iter().find(|&t| {
        carrier(t) == held
            && blocks > 0
            && t.type_size() as i32 * blocks == elements * held.size_bytes() as i32
    })
}

impl BlockArray {
    /// Encodes the last axis of `x` (a multiple of 32 values).
    pub fn encode(x: &Array, dtype: GgufDtype) -> Result<BlockArray, CacheError> {
        let mut shape = x.shape();
        let dim = shape.last().copied().unwrap_or(0);
        validate(dtype, dim)?;
        let held = carrier(dtype);
        if let Some(last) = shape.last_mut() {
            *last = dim / BLOCK_VALUES as i32 * dtype.type_size() as i32 / held.size_bytes() as i32;
        }
        if default_device()? == Device::Gpu {
            let blocks = x.size() as i32 / BLOCK_VALUES as i32;
            let bytes = gpu_codec(Codec::Encode, x, (shape, held), dtype, blocks)?;
            return Ok(BlockArray { bytes, dtype });
        }
        let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
            quantize_into(dtype, floats(inputs[0])?, out).map_err(|e| e.to_string())
        });
        let values = x.astype(Dtype::Float32)?;
        let bytes = cpu_kernel(&[&values], &shape, held, kernel)?;
        Ok(BlockArray { bytes, dtype })
    }

    /// The vectors as stored, in `dtype` (decoded in f32 as ggml decodes
    /// them, then cast).
    pub fn decode(&self, dtype: Dtype) -> Result<Array, CacheError> {
        let mut shape = self.bytes.shape();
        let block_bytes = self.dtype.type_size() as i32;
        let held = self.bytes.dtype().size_bytes() as i32;
        if let Some(last) = shape.last_mut() {
            *last = *last * held / block_bytes * BLOCK_VALUES as i32;
        }
        let format = self.dtype;
        let values = if default_device()? == Device::Gpu {
            let blocks = self.bytes.nbytes() as i32 / block_bytes;
            gpu_codec(
                Codec::Decode,
                &self.bytes,
                (shape, Dtype::Float32),
                format,
                blocks,
            )?
        } else {
            let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
                dequantize_into(format, inputs[0], floats_mut(out)?).map_err(|e| e.to_string())
            });
            cpu_kernel(&[&self.bytes], &shape, Dtype::Float32, kernel)?
        };
        Ok(if dtype == Dtype::Float32 {
            values
        } else {
            values.astype(dtype)?
        })
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        self.bytes.nbytes()
    }
}

/// Which way a GPU codec kernel goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Codec {
    /// Floats of any dtype into blocks.
    Encode,
    /// Blocks into float32 values.
    Decode,
}

/// The kernel body of `codec`: a thread per block.
fn codec_body(codec: Codec) -> &'static str {
    match codec {
        Codec::Encode => {
            r#"
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= BLOCKS) return;
  float v[32];
  for (int j = 0; j < 32; ++j) v[j] = static_cast<float>(x[static_cast<size_t>(t) * 32 + j]);
  gemma_kv_quantize<Q>(v, reinterpret_cast<unsigned char*>(out) + static_cast<size_t>(t) * gemma_kv_type<Q>::BYTES);
"#
        }
        Codec::Decode => {
            r#"
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= BLOCKS) return;
  float v[32];
  gemma_kv_dequantize<Q>(reinterpret_cast<const unsigned char*>(x) + static_cast<size_t>(t) * gemma_kv_type<Q>::BYTES, v);
  for (int j = 0; j < 32; ++j) out[static_cast<size_t>(t) * 32 + j] = v[j];
"#
        }
    }
}

/// `codec` of `blocks` blocks of `dtype` on the GPU: `x` (floats, or the
/// blocks' carrier array) into an array of `shape` and `out_dtype`.
fn gpu_codec(
    codec: Codec,
    x: &Array,
    (shape, out_dtype): (Vec<i32>, Dtype),
    dtype: GgufDtype,
    blocks: i32,
) -> Result<Array, CacheError> {
    static KERNELS: [OnceLock<Arc<CudaKernel>>; 2] = [OnceLock::new(), OnceLock::new()];
    if blocks == 0 {
        return Ok(mlx_core::zeros(&shape, out_dtype)?);
    }
    let q = kv_block_type(dtype)
        .ok_or_else(|| CacheError::Format(format!("{dtype} has no GPU kernel for KV blocks")))?;
    let slot = &KERNELS[usize::from(codec == Codec::Decode)];
    let kernel = match slot.get() {
        Some(k) => k.clone(),
        None => {
            let name = match codec {
                Codec::Encode => "gemma_kv_block_encode",
                Codec::Decode => "gemma_kv_block_decode",
            };
            let k = Arc::new(CudaKernel::new(
                name,
                &["x"],
                &["out"],
                codec_body(codec),
                KV_BLOCKS_CUDA,
            )?);
            slot.get_or_init(|| k).clone()
        }
    };
    let mut out = kernel.apply(
        &[x],
        &[OutputSpec {
            shape,
            dtype: out_dtype,
        }],
        Launch {
            grid: [(blocks + THREADS - 1) / THREADS * THREADS, 1, 1],
            block: [THREADS, 1, 1],
            shared_bytes: 0,
        },
        &[
            ("Q", TemplateArg::Int(q)),
            ("BLOCKS", TemplateArg::Int(blocks)),
        ],
    )?;
    out.pop()
        .ok_or_else(|| CacheError::Format("the KV block kernel returned nothing".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of an int8 or int16 array, in memory order.
    fn raw_bytes(a: &Array) -> Vec<u8> {
        match a.dtype() {
            Dtype::Int8 => a.to_vec::<i8>().unwrap().iter().map(|&b| b as u8).collect(),
            _ => a
                .to_vec::<i16>()
                .unwrap()
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        }
    }

    #[test]
    fn vectors_round_trip_through_ggml_blocks() {
        let x: Vec<f32> = (0..2 * 3 * 64)
            .map(|i| ((i * 29 % 97) as f32 - 48.0) / 16.0)
            .collect();
        let array = Array::from_slice(&x, &[1, 2, 3, 64]).unwrap();
        for dtype in QUANTIZABLE {
            let stored = BlockArray::encode(&array, dtype).unwrap();
            let per_vector = 2 * dtype.type_size() as i32 / carrier(dtype).size_bytes() as i32;
            assert_eq!(stored.bytes.shape(), vec![1, 2, 3, per_vector], "{dtype}");
            let bytes = raw_bytes(&stored.bytes);
            let mut expected = vec![0u8; bytes.len()];
            quantize_into(dtype, &x, &mut expected).unwrap();
            assert_eq!(
                bytes, expected,
                "{dtype}: the kernel writes the quantizer's bytes"
            );
            let decoded = stored.decode(Dtype::Float32).unwrap();
            assert_eq!(decoded.shape(), vec![1, 2, 3, 64]);
            let mut want = vec![0f32; x.len()];
            dequantize_into(dtype, &expected, &mut want).unwrap();
            assert_eq!(decoded.to_vec::<f32>().unwrap(), want, "{dtype}");
        }
    }

    #[test]
    fn the_type_follows_from_the_bytes_per_vector() {
        for dtype in QUANTIZABLE {
            let held = carrier(dtype);
            let elements = 8 * dtype.type_size() as i32 / held.size_bytes() as i32;
            assert_eq!(dtype_of(held, elements, 256), Some(dtype));
        }
        assert_eq!(dtype_of(Dtype::Int8, 19 * 8, 256), None);
        assert_eq!(
            dtype_of(Dtype::Int16, 8 * 18 / 2, 256),
            Some(GgufDtype::IQ4_NL)
        );
        assert_eq!(dtype_of(Dtype::Int8, 8 * 18, 256), Some(GgufDtype::Q4_0));
    }

    #[test]
    fn other_types_and_head_sizes_are_refused() {
        let e = validate(GgufDtype::Q6_K, 256).unwrap_err().to_string();
        assert!(e.contains("Q6_K") && e.contains("Q8_0"), "{e}");
        let e = validate(GgufDtype::Q8_0, 48).unwrap_err().to_string();
        assert!(e.contains("48"), "{e}");
    }
}
