//! What a generation is asked to do, and why it stopped.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use gemma::cache::CacheFormat;
use sample::SamplerConfig;
use serde::Serialize;

/// Settings of one generation.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How tokens are chosen.
    pub sampler: SamplerConfig,
    /// Text that ends the generation when it appears (not included in the result).
    pub stop_strings: Vec<String>,
    /// Storage of the KV cache.
    pub cache_format: CacheFormat,
    /// Tokens kept in the compute dtype before the cache starts quantizing
    /// (mlx-lm's `quantized_kv_start`); prefill chunks are cut there.
    pub kv_start: usize,
    /// Prompt tokens run per forward pass.
    pub prefill_chunk: usize,
    /// Set from any thread to stop the generation at the next token.
    pub cancel: Arc<AtomicBool>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampler: SamplerConfig::default(),
            stop_strings: Vec::new(),
            cache_format: CacheFormat::COMPUTE,
            kv_start: 0,
            prefill_chunk: 2048,
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
