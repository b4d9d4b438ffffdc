//! Choosing, loading and placing the model.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use engine::Engine;
use gemma::config::Gemma3Config;
use gemma::load::{
    load_with, Arithmetic, CpuKernels, LoadOptions, ModelSource, TokenizerBuild, WeightStorage,
};
use indicatif::{ProgressBar, ProgressStyle};
use mlx_core::{device, memory, Device, Dtype};

/// Where the model comes from and how it runs.
#[derive(Debug, Args, Clone)]
pub struct ModelArgs {
    /// A GGUF file or a safetensors checkpoint folder (default: the model
    /// provisioned by `cargo xtask setup`).
    #[arg(long, conflicts_with = "random_weights")]
    pub model: Option<PathBuf>,
    /// Random weights of a published size: 270m, 1b, 4b, 12b, 27b.
    #[arg(long)]
    pub random_weights: Option<String>,
    /// With --random-weights: keep only the first N layers.
    #[arg(long, requires = "random_weights")]
    pub layers: Option<usize>,
    /// Compute device (default: gpu when this MLX build has one).
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Compute dtype (default: float32 on cpu, bfloat16 on gpu).
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// Quantize the weights after loading (MLX affine, group 64).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["4", "8"]))]
    pub quantize_weights: Option<String>,
    /// How a GGUF file's block-quantized weights are held: `native` as
    /// stored, multiplied by our CPU kernels (the default on the CPU in
    /// float32) or GPU kernels (the default on the GPU: Q4_0, Q5_0, Q8_0,
    /// Q4_K, Q5_K, Q6_K; other types are dequantized at load; a quarter of
    /// the memory and a fifth of the start-up time), or `dequantized` to the
    /// compute dtype at load (the default on the CPU in other dtypes, and
    /// the path that matches mlx-lm's logits). With
    /// `native` and `int8` activations on the CPU, MLX affine 4- and 8-bit
    /// weights (a quantized checkpoint, or `--quantize-weights`) take our
    /// kernel too instead of MLX's `quantized_matmul`.
    #[arg(long, value_enum)]
    pub weights: Option<WeightsArg>,
    /// With `--weights native`, how one row of activations enters the
    /// products: `int8`, quantized to 8 bits per block as llama.cpp does (the
    /// default), or `f32`, the exact path. The CPU kernel family multiplying
    /// 8-bit activations is the widest this CPU runs, or the one
    /// GEMMA_MLX_CPU_KERNELS names (portable, avx2, avx512).
    #[arg(long, value_enum, default_value_t = ActivationsArg::Int8)]
    pub activations: ActivationsArg,
    /// MLX memory limit, in GiB.
    #[arg(long)]
    pub max_memory: Option<f64>,
    /// MLX buffer-cache limit, in GiB.
    #[arg(long)]
    pub cache_limit: Option<f64>,
    /// On the GPU, run our own CUDA kernels (one per layer in compiled decode
    /// steps; GEMV, fused norms, q/k norm with RoPE otherwise) in place of
    /// MLX's operations: on unless `--gpu-kernels=false`. Each is compiled
    /// once per machine and kept in ~/.cache/gemma-mlx/kernels
    /// (GEMMA_MLX_KERNEL_CACHE: another folder; empty: none).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub gpu_kernels: Option<bool>,
}

/// Devices on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DeviceArg {
    /// The CPU.
    Cpu,
    /// The GPU.
    Gpu,
}

/// Dtypes on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DtypeArg {
    /// float32.
    Float32,
    /// bfloat16.
    Bfloat16,
    /// float16.
    Float16,
}

/// How GGUF block-quantized weights are held, on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WeightsArg {
    /// As stored, multiplied by our CPU kernels.
    Native,
    /// Dequantized to the compute dtype at load.
    Dequantized,
}

/// How activations enter products with native weights, on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ActivationsArg {
    /// Quantized to 8 bits per block, multiplied as integers.
    Int8,
    /// Float32.
    F32,
}

/// The model `cargo xtask setup` provisions.
pub fn default_model_path() -> PathBuf {
    if let Some(path) = std::env::var_os("GEMMA_MLX_MODEL") {
        return PathBuf::from(path);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/model/gemma-3-270m-q4_k_m.gguf")
}

fn gib(value: f64, flag: &str) -> Result<usize> {
    if !(value.is_finite() && value > 0.0) {
        bail!("{flag} must be a positive number of GiB, got {value}");
    }
    Ok((value * (1u64 << 30) as f64) as usize)
}

impl ModelArgs {
    /// Selects the device and applies the memory limits; returns the device.
    pub fn place(&self) -> Result<Device> {
        let device = match self.device {
            Some(DeviceArg::Cpu) => Device::Cpu,
            Some(DeviceArg::Gpu) => Device::Gpu,
            None if device::is_available(Device::Gpu)? => Device::Gpu,
            None => Device::Cpu,
        };
        device::set_default_device(device)?;
        if let Some(limit) = self.max_memory {
            memory::set_memory_limit(gib(limit, "--max-memory")?)?;
        }
        if let Some(limit) = self.cache_limit {
            memory::set_cache_limit(gib(limit, "--cache-limit")?)?;
        }
        Ok(device)
    }

    /// Whether the model is to run our GPU kernels where it computes on the
    /// GPU (the default).
    pub fn runs_gpu_kernels(&self) -> bool {
        self.gpu_kernels.unwrap_or(true)
    }

    /// How weights are held on `device` in `dtype`: as asked, else as stored
    /// on the GPU and on the CPU in float32 (our kernels), and dequantized
    /// on the CPU in other dtypes (which our CPU kernels do not compute
    /// in). On an H100, 12B Q4_K_M as stored decoded faster than dequantized
    /// (123.9 tok/s with its K-quants on the tensor cores, against 88.6) in
    /// 9.1 GB instead of 33 GB, starting in 8 s instead of 37; 1B decoded at
    /// 0.85× (docs/performance.md).
    pub fn weights(&self, device: Device, dtype: Dtype) -> WeightsArg {
        self.weights.unwrap_or(match (device, dtype) {
            (Device::Gpu, _) | (Device::Cpu, Dtype::Float32) => WeightsArg::Native,
            (Device::Cpu, _) => WeightsArg::Dequantized,
        })
    }

    /// The compute dtype on `device`.
    pub fn dtype(&self, device: Device) -> Dtype {
        match (self.dtype, device) {
            (Some(DtypeArg::Float32), _) | (None, Device::Cpu) => Dtype::Float32,
            (Some(DtypeArg::Bfloat16), _) | (None, Device::Gpu) => Dtype::Bfloat16,
            (Some(DtypeArg::Float16), _) => Dtype::Float16,
        }
    }

    /// Where the weights come from.
    pub fn source(&self) -> Result<ModelSource> {
        Ok(match (&self.model, &self.random_weights) {
            (_, Some(size)) => ModelSource::Random {
                config: Box::new(Gemma3Config::published(size, self.layers)?),
                seed: 0,
            },
            (Some(path), None) => ModelSource::from_path(path),
            (None, None) => {
                let path = default_model_path();
                if !path.exists() {
                    bail!(
                        "no --model given and the default model {} is missing: run `cargo xtask setup` (or pass --model PATH)",
                        path.display()
                    );
                }
                ModelSource::Gguf(path)
            }
        })
    }

    /// Places, then loads the model with a progress bar on stderr (hidden when `quiet`).
    pub fn load(&self, quiet: bool) -> Result<Engine> {
        self.load_with(quiet, TokenizerBuild::Now)
    }

    /// [`ModelArgs::load`], building a GGUF file's tokenizer as `tokenizer` says.
    pub fn load_with(&self, quiet: bool, tokenizer: TokenizerBuild) -> Result<Engine> {
        let device = self.place()?;
        let dtype = self.dtype(device);
        let quantize = self
            .quantize_weights
            .as_deref()
            .map(|b| (if b == "8" { 8 } else { 4 }, 64));
        let source = self.source()?;
        let kernels = CpuKernels::from_env()?;
        let bar = progress_bar(&source, quiet);
        let mut loaded = load_with(
            &source,
            LoadOptions {
                dtype,
                quantize,
                weights: match self.weights(device, dtype) {
                    WeightsArg::Native => WeightStorage::Native(match self.activations {
                        ActivationsArg::Int8 => Arithmetic::int8(kernels),
                        ActivationsArg::F32 => Arithmetic::f32(),
                    }),
                    WeightsArg::Dequantized => WeightStorage::Dequantized,
                },
            },
            tokenizer,
            &mut |done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            },
        )
        .with_context(|| "loading the model")?;
        bar.finish_and_clear();
        loaded.model.gpu_kernels = self.runs_gpu_kernels();
        Ok(Engine::new(loaded))
    }
}

/// A bar over tensors read (hidden when `quiet`).
pub fn progress_bar(source: &ModelSource, quiet: bool) -> ProgressBar {
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} tensors")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(match source {
        ModelSource::Gguf(p) | ModelSource::Folder(p) => p.display().to_string(),
        ModelSource::Random { .. } => "random weights".into(),
    });
    bar
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use mlx_core::{Device, Dtype};

    use super::{ModelArgs, WeightsArg};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        model: ModelArgs,
    }

    fn weights(args: &[&str], device: Device, dtype: Dtype) -> WeightsArg {
        let cli = Cli::try_parse_from(std::iter::once("gemma-mlx").chain(args.iter().copied()))
            .expect("the arguments parse");
        cli.model.weights(device, dtype)
    }

    #[test]
    fn gguf_blocks_stay_as_stored_by_default_on_the_gpu_and_in_float32_on_the_cpu() {
        assert_eq!(
            weights(&[], Device::Gpu, Dtype::Bfloat16),
            WeightsArg::Native
        );
        assert_eq!(
            weights(&[], Device::Gpu, Dtype::Float32),
            WeightsArg::Native
        );
        assert_eq!(
            weights(&[], Device::Cpu, Dtype::Float32),
            WeightsArg::Native
        );
        assert_eq!(
            weights(&[], Device::Cpu, Dtype::Bfloat16),
            WeightsArg::Dequantized
        );
        let asked = ["--weights", "dequantized"];
        assert_eq!(
            weights(&asked, Device::Gpu, Dtype::Bfloat16),
            WeightsArg::Dequantized
        );
    }
}
