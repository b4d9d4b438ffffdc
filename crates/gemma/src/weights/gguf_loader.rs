//! Loading a GGUF file's tensors: dequantized (in parallel) to f32 on the
//! host, then handed to MLX in the compute dtype; or, with `native`, the
//! block-quantized matrices as stored: on the CPU for our CPU kernels, read
//! from the file straight into MLX's memory (no second copy in the
//! process); on the GPU for our GPU kernels (the types they decode; the
//! others dequantized), copied once from the mapped file.

use std::path::Path;

use mlx_core::device::default_device;
use mlx_core::{Array, Device, Dtype};

use super::gguf_names::hf_name;
use super::tensors::{Tensor, TensorMap, WeightsError};
use crate::cuda::reads_blocks;
use crate::gguf::GgufFile;
use crate::linear::GgufMatrix;
use crate::quant::{can_multiply, Arithmetic, GgufDtype};

/// Reads every tensor of `file` into a [`TensorMap`] with Hugging Face names,
/// converted to `dtype`; with `native`, matrices of block-quantized types
/// stay as stored (on the CPU, in float32 only), their products computed as
/// it says. `progress(done, total)` is called after each tensor.
pub fn load_gguf_tensors(
    file: &GgufFile,
    dtype: Dtype,
    native: Option<Arithmetic>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<TensorMap, WeightsError> {
    let path: &Path = file.path();
    let invalid = |message: String| WeightsError::Invalid {
        file: path.to_path_buf(),
        message,
    };
    let device = default_device()?;
    if native.is_some() && device == Device::Cpu && dtype != Dtype::Float32 {
        return Err(invalid(format!(
            "GGUF weights as stored are multiplied on the CPU in float32 only (asked: {dtype:?}); load them dequantized there"
        )));
    }
    let as_stored = |t: GgufDtype| can_multiply(t) && (device == Device::Cpu || reads_blocks(t));
    // llama.cpp's converter stores Gemma's norm weights with the 1 added.
    let mut map = TensorMap::new(path, true);
    let total = file.tensors().len();
    for (done, info) in file.tensors().iter().enumerate() {
        let name = hf_name(&info.name)
            .ok_or_else(|| invalid(format!("tensor '{}' is not a Gemma 3 tensor", info.name)))?;
        let shape = info
            .row_major_shape()
            .iter()
            .map(|&d| i32::try_from(d))
            .collect::<Result<Vec<i32>, _>>()
            .map_err(|_| invalid(format!("tensor '{}' has a dimension too large", info.name)))?;
        if let Some(arithmetic) = native.filter(|_| shape.len() == 2 && as_stored(info.dtype)) {
            let len = file.tensor_bytes(info).len();
            let row_bytes = i32::try_from(len / shape[0].max(1) as usize)
                .map_err(|_| invalid(format!("tensor '{}' has rows too large", info.name)))?;
            let stored = [shape[0], row_bytes];
            let bytes = if device == Device::Cpu {
                Array::from_fill(&stored, Dtype::Uint8, |buf| {
                    file.read_tensor_into(info, buf)
                })?
                .map_err(|e| invalid(e.problem.to_string()))?
            } else {
                let bytes = Array::from_bytes(file.tensor_bytes(info), &stored, Dtype::Uint8)?;
                bytes.eval()?;
                bytes
            };
            let matrix = GgufMatrix {
                bytes,
                dtype: info.dtype,
                cols: shape[1],
                arithmetic,
            };
            map.tensors.insert(name, Tensor::Gguf(matrix));
            progress(done + 1, total);
            continue;
        }
        let values = file
            .dequantize_f32(&info.name)
            .map_err(|e| invalid(e.problem.to_string()))?;
        let array = Array::from_slice(&values, &shape)?;
        drop(values);
        let array = if dtype == Dtype::Float32 {
            array
        } else {
            array.astype(dtype)?
        };
        array.eval()?;
        map.tensors.insert(name, Tensor::Dense(array));
        progress(done + 1, total);
    }
    Ok(map)
}
