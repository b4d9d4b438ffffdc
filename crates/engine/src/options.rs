//! What a generation is asked to do, and why it stopped.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use gemma::cache::{CacheFormat, LayerFormats, QueryRounding};
use gemma::model::Gemma3;
use mlx_core::device::default_device;
use mlx_core::Device;
use sample::SamplerConfig;
use serde::Serialize;

/// Prompt tokens per forward pass by default on `device`: 256 on the CPU,
/// 2048 (mlx-lm's default) on the GPU. The attention scores every query of
/// a chunk against every key it holds (masked or not), and a chunk's
/// activations and scores are held at once, so the CPU's chunks stay short.
/// On the default model (Xeon, `avx512`, the norms and RoPE on our
/// operations), 512-token prompts ran at 600–614 / 647–655 / 457–470 tok/s
/// in chunks of 256 / 512 / 128, 2048-token prompts at 511–524 / 540–585 /
/// 543–570 in chunks of 256 / 512 / 1024; chunks of 512 raised the peak
/// resident memory of a 512-token prompt from 360–361 to 389–397 MiB, past
/// the 1.1× of llama.cpp's that the CPU keeps to.
pub fn default_prefill_chunk(device: Device) -> usize {
    match device {
        Device::Cpu => 256,
        Device::Gpu => 2048,
    }
}

/// Decode steps queued per host-device synchronisation by default on
/// `device`: 1 on the CPU, where batching gained nothing measurable and
/// tokens stream one by one; 16 on the GPU. On the H200 (compiled step with
/// our kernels) batches of 8 decoded 1.16–1.56× as many tokens per second
/// as single steps, and batches of 16 beat batches of 8 in 9 of 10 pairs
/// measured in one call each (0.96–1.16×: 270M 906–1067 against 808–922
/// tok/s, 1B 476–580 against 478–530, 27B 57.2 and 57.6 against 56.9 and
/// 57.3), while 32 or 64 gained nothing more (docs/performance.md).
pub fn default_steps_per_sync(device: Device) -> usize {
    match device {
        Device::Cpu => 1,
        Device::Gpu => 16,
    }
}

/// The decoding mode the `gemma-mlx` command line picks when none is asked
/// for, where `model` computes now: [`DecodeMode::Compiled`] where the
/// compiled step runs every block as one kernel of ours (on the GPU with our
/// kernels, [`Gemma3::runs_gpu_kernels`]; on the CPU with every projection
/// on our CPU kernels, [`Gemma3::has_cpu_layers`]), [`DecodeMode::Eager`]
/// otherwise.
pub fn default_decode(model: &Gemma3) -> mlx_core::Result<DecodeMode> {
    let layer_kernels = match default_device()? {
        Device::Gpu => model.runs_gpu_kernels()?,
        Device::Cpu => model.has_cpu_layers()?,
    };
    Ok(if layer_kernels {
        DecodeMode::Compiled
    } else {
        DecodeMode::Eager
    })
}

/// How single tokens are decoded after the prompt.
///
/// Eager is the library's default on both devices ([`default_decode`] is the
/// command line's). The compiled step pays where it runs every block as one
/// kernel of ours: on the H200 with our kernels (`Gemma3::gpu_kernels`) it
/// decodes 2.0–4.7× as fast as eager at 270M and 1B, and on the CPU with
/// the weights as stored on our kernels (`Gemma3::has_cpu_layers`) about
/// 1.9× at the default model. Elsewhere it gains little: on the CPU both
/// modes are bound by MLX's operations, and on the GPU MLX compiles its own
/// fused kernels for seconds before the first token (docs/performance.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DecodeMode {
    /// The eager forward pass: the graph built anew for every token.
    #[default]
    Eager,
    /// The fixed-shape step of [`gemma::forward::decode_step`], compiled by MLX, over
    /// caches of every format (eager only where a cache would change format
    /// during the generation, `start=N` past the prompt). The caches are
    /// reserved up front for `max_tokens` more tokens (at most the
    /// context); MLX's CPU attention then reads the whole reservation at
    /// every step, our kernels (the GPU's, the CPU blocks') only the
    /// positions filled.
    Compiled,
}

/// Settings of one generation.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How tokens are chosen.
    pub sampler: SamplerConfig,
    /// Text that ends the generation when it appears (not included in the result).
    pub stop_strings: Vec<String>,
    /// Storage of each layer's KV cache.
    pub cache_formats: LayerFormats,
    /// Tokens kept in the compute dtype before the cache starts quantizing
    /// (mlx-lm's `quantized_kv_start`); prefill chunks are cut there.
    pub kv_start: usize,
    /// How attention treats the queries (`attn=` of the KV spec; rounding
    /// them decodes eagerly).
    pub kv_queries: QueryRounding,
    /// Prompt tokens run per forward pass (default:
    /// [`default_prefill_chunk`] of the default device).
    pub prefill_chunk: usize,
    /// How tokens after the prompt are decoded.
    pub decode: DecodeMode,
    /// Decode steps queued on the device as one evaluation (at least 1); the
    /// next batch is queued while the device still runs one, and read back
    /// as one array. Each evaluation costs a host-device synchronisation
    /// (MLX signals its end through managed memory). With more than 1,
    /// tokens arrive in bursts, and a stop leaves up to
    /// `2 × steps_per_sync − 1` steps run past it: the caches then hold
    /// tokens after the returned ones (a [`crate::chat::ChatSession`] trims
    /// them).
    pub steps_per_sync: usize,
    /// Set from any thread to stop the generation at the next token.
    pub cancel: Arc<AtomicBool>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        let device = default_device().unwrap_or(Device::Cpu);
        GenerateOptions {
            max_tokens: 256,
            sampler: SamplerConfig::default(),
            stop_strings: Vec::new(),
            cache_formats: LayerFormats::Uniform(CacheFormat::COMPUTE),
            kv_start: 0,
            kv_queries: QueryRounding::Exact,
            prefill_chunk: default_prefill_chunk(device),
            decode: DecodeMode::default(),
            steps_per_sync: default_steps_per_sync(device),
            cancel: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced `<eos>` or `<end_of_turn>`.
    Stop,
    /// A stop string appeared.
    StopString,
    /// `max_tokens` were generated.
    Length,
    /// The generation was cancelled.
    Cancelled,
}

#[cfg(test)]
mod tests {
    use super::*;
    use gemma::config::Gemma3Config;
    use gemma::load::{load, Arithmetic, CpuKernels, LoadOptions, ModelSource, WeightStorage};
    use mlx_core::block_dot::affine_rows_dot_available;
    use mlx_core::Dtype;

    fn tiny(quantize: Option<(i32, i32)>, weights: WeightStorage) -> Gemma3 {
        let mut c = Gemma3Config::published("270m", Some(2)).unwrap();
        (c.vocab_size, c.hidden_size, c.intermediate_size) = (256, 64, 128);
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim) = (4, 1, 64);
        let source = ModelSource::Random {
            config: Box::new(c),
            seed: 3,
        };
        let options = LoadOptions {
            dtype: Dtype::Float32,
            quantize,
            weights,
        };
        load(&source, options, &mut |_, _| {}).unwrap().model
    }

    #[test]
    fn the_cpu_decodes_compiled_by_default_only_with_its_block_kernels() {
        let best = CpuKernels::best().unwrap();
        if default_device().unwrap() != Device::Cpu
            || !affine_rows_dot_available(best, 4, 64).unwrap()
        {
            println!("SKIPPED: not the CPU, or no affine kernel on it");
            return;
        }
        let dense = tiny(None, WeightStorage::Dequantized);
        assert_eq!(default_decode(&dense).unwrap(), DecodeMode::Eager);
        let mlx_quantized = tiny(Some((4, 64)), WeightStorage::Dequantized);
        assert_eq!(default_decode(&mlx_quantized).unwrap(), DecodeMode::Eager);
        let ours = tiny(Some((4, 64)), WeightStorage::Native(Arithmetic::int8(best)));
        assert_eq!(default_decode(&ours).unwrap(), DecodeMode::Compiled);
    }
}
