//! The model and the arrays the benchmarks feed it.

use std::path::PathBuf;

use gemma::load::{load, LoadOptions, ModelSource, WeightStorage};
use gemma::model::Gemma3;
use mlx_core::{random, Array, Dtype};

use crate::{BenchError, Settings};

/// The environment variable naming another GGUF file than the default model.
pub const MODEL_VAR: &str = "GEMMA_MLX_MODEL";

/// Seed of the random weights.
const WEIGHT_SEED: u64 = 0;

/// A model to measure and where it came from.
#[derive(Debug)]
pub struct BenchModel {
    /// The model, its weights evaluated.
    pub model: Gemma3,
    /// The GGUF file name, or `random-…` for random weights.
    pub name: String,
}

/// The workspace root (this crate's parent folder).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The default model: `<workspace>/target/model/gemma-3-270m-q4_k_m.gguf`.
pub fn default_model_path() -> PathBuf {
    workspace_root().join("target/model/gemma-3-270m-q4_k_m.gguf")
}

/// Where the weights come from: on the CPU the GGUF file `GEMMA_MLX_MODEL`
/// names (an error if it is missing), else the default model when present,
/// else random weights of the settings' size; on the GPU, and in a smoke
/// run, always random weights of [`Settings::config`].
pub fn model_source(settings: &Settings) -> Result<ModelSource, BenchError> {
    let random = || -> Result<ModelSource, BenchError> {
        Ok(ModelSource::Random {
            config: Box::new(settings.config()?),
            seed: WEIGHT_SEED,
        })
    };
    if settings.smoke || settings.device != mlx_core::Device::Cpu {
        return random();
    }
    if let Some(path) = std::env::var_os(MODEL_VAR) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(BenchError::Settings(format!(
                "{MODEL_VAR}={}: no such file",
                path.display()
            )));
        }
        return Ok(ModelSource::Gguf(path));
    }
    let path = default_model_path();
    if path.is_file() {
        Ok(ModelSource::Gguf(path))
    } else {
        random()
    }
}

/// Loads the model of [`model_source`] in the settings' dtype, unquantized,
/// and evaluates its weights so that loading stays out of the measurements.
pub fn load_model(settings: &Settings) -> Result<BenchModel, BenchError> {
    let source = model_source(settings)?;
    let options = LoadOptions {
        dtype: settings.dtype,
        quantize: None,
        weights: WeightStorage::Dequantized,
    };
    let loaded = load(&source, options, &mut |_, _| {})?;
    mlx_core::eval(&loaded.model.arrays())?;
    Ok(BenchModel {
        model: loaded.model,
        name: loaded.name,
    })
}

/// An evaluated array of normal values (mean 0, deviation `std`) from `seed`.
pub fn random_array(shape: &[i32], dtype: Dtype, std: f32, seed: u64) -> Result<Array, BenchError> {
    let key = random::key(seed)?;
    let a = random::normal(shape, dtype, 0.0, std, Some(&key))?;
    a.eval()?;
    Ok(a)
}

/// `n` token ids drawn uniformly from `0..vocab`, reproducible from `seed`.
pub fn random_tokens(n: usize, vocab: usize, seed: u64) -> Result<Vec<u32>, BenchError> {
    let len = i32::try_from(n)
        .map_err(|_| BenchError::Settings(format!("{n} tokens are too many for one array")))?;
    let key = random::key(seed)?;
    let ids = random::uniform(0.0, vocab as f32, &[len], Dtype::Float32, Some(&key))?
        .floor()?
        .astype(Dtype::Int32)?
        .to_vec::<i32>()?;
    let top = vocab.saturating_sub(1);
    Ok(ids
        .into_iter()
        .map(|id| usize::try_from(id).unwrap_or(0).min(top) as u32)
        .collect())
}

/// Token ids as the `[1, n]` int32 array the model takes.
pub fn token_array(tokens: &[u32]) -> Result<Array, BenchError> {
    let ids: Vec<i32> = tokens
        .iter()
        .map(|&t| i32::try_from(t).unwrap_or(i32::MAX))
        .collect();
    let len = i32::try_from(ids.len())
        .map_err(|_| BenchError::Settings(format!("{} tokens are too many", ids.len())))?;
    Ok(Array::from_slice(&ids, &[1, len])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tokens_are_in_range_and_reproducible() {
        let a = random_tokens(1000, 7, 3).unwrap();
        assert_eq!(a.len(), 1000);
        assert!(a.iter().all(|&t| t < 7));
        for id in 0..7 {
            assert!(a.contains(&id), "token {id} never drawn");
        }
        assert_eq!(a, random_tokens(1000, 7, 3).unwrap());
        assert_ne!(a, random_tokens(1000, 7, 4).unwrap());
    }

    #[test]
    fn token_array_is_one_row() {
        let a = token_array(&[5, 1, 9]).unwrap();
        assert_eq!(a.shape(), vec![1, 3]);
        assert_eq!(a.to_vec::<i32>().unwrap(), vec![5, 1, 9]);
    }

    #[test]
    fn default_model_is_under_the_workspace_target() {
        let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
        assert!(manifest.contains("[workspace]"));
        assert_eq!(
            default_model_path(),
            workspace_root().join("target/model/gemma-3-270m-q4_k_m.gguf")
        );
    }
}
