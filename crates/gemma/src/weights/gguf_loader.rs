//! Loading a GGUF file's tensors: dequantized (in parallel) to f32 on the
//! host, then handed to MLX in the compute dtype.

use std::path::Path;

use mlx_core::{Array, Dtype};

use super::gguf::GgufFile;
use super::gguf_names::hf_name;
use super::tensors::{Tensor, TensorMap, WeightsError};

/// Reads every tensor of `file` into a [`TensorMap`] with Hugging Face names,
/// converted to `dtype`. `progress(done, total)` is called after each tensor.
pub fn load_gguf_tensors(
    file: &GgufFile,
    dtype: Dtype,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<TensorMap, WeightsError> {
    let path: &Path = file.path();
    let invalid = |message: String| WeightsError::Invalid {
        file: path.to_path_buf(),
        message,
    };
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
