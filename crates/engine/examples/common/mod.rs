//! What the examples share: loading the default model the way `gemma-mlx`
//! does when it is given no `--model`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use engine::Engine;
use gemma::load::{load, Arithmetic, CpuKernels, LoadOptions, ModelSource, WeightStorage};
use mlx_core::{device, Device, Dtype};

/// The model `cargo xtask setup` provisions: `GEMMA_MLX_MODEL` when set,
/// else `target/model/gemma-3-270m-q4_k_m.gguf` in the workspace.
pub fn default_model_path() -> PathBuf {
    match std::env::var_os("GEMMA_MLX_MODEL") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/model/gemma-3-270m-q4_k_m.gguf"),
    }
}

/// Loads the default model with `gemma-mlx`'s defaults: on the GPU when
/// this MLX build has one (bfloat16, dequantized weights, our GPU kernels),
/// else on the CPU (float32, the GGUF blocks as stored with 8-bit
/// activations on the CPU kernel family `GEMMA_MLX_CPU_KERNELS` names, or
/// the widest this CPU runs).
pub fn load_default_engine() -> Result<Engine> {
    let path = default_model_path();
    if !path.is_file() {
        bail!(
            "the default model {} is missing: run `cargo xtask setup` (or set GEMMA_MLX_MODEL)",
            path.display()
        );
    }
    let device = if device::is_available(Device::Gpu)? {
        Device::Gpu
    } else {
        Device::Cpu
    };
    device::set_default_device(device)?;
    let dtype = match device {
        Device::Gpu => Dtype::Bfloat16,
        Device::Cpu => Dtype::Float32,
    };
    let weights = match device {
        Device::Gpu => WeightStorage::Dequantized,
        Device::Cpu => WeightStorage::Native(Arithmetic::int8(CpuKernels::from_env()?)),
    };
    let options = LoadOptions {
        dtype,
        quantize: None,
        weights,
    };
    let mut loaded = load(&ModelSource::Gguf(path.clone()), options, &mut |_, _| {})
        .with_context(|| format!("loading {}", path.display()))?;
    loaded.model.gpu_kernels = true;
    Ok(Engine::new(loaded))
}
