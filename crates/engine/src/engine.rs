//! `Engine`: a loaded model with the calls users of the earlier tools make —
//! generate, chat, tokenize, metadata.

use gemma::cache::LayerCache;
use gemma::chat_template::ChatMessage;
use gemma::load::{LoadedModel, WeightStorage};
use gemma::tokenizer::Tokenizer;
use mlx_core::device;
use serde::Serialize;

use crate::error::GenerateError;
use crate::generate::{generate, Generation, TokenEvent};
use crate::options::GenerateOptions;

/// What a model is: for `info` and for reports.
#[derive(Debug, Clone, Serialize)]
pub struct ModelMetadata {
    /// The file or folder name, or `random-…`.
    pub name: String,
    /// Transformer blocks.
    pub layers: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Query heads.
    pub attention_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Sliding window of local layers.
    pub sliding_window: usize,
    /// Context length.
    pub context_length: usize,
    /// Parameters.
    pub parameters: usize,
    /// Bytes of the weights as held.
    pub weight_bytes: usize,
    /// Compute dtype.
    pub dtype: String,
    /// Weight quantization: MLX affine ("4-bit, group 64"), GGUF blocks held
    /// as stored ("GGUF blocks as stored: Q8_0, Q5_0, …"), or "none".
    pub quantization: String,
    /// MLX's version.
    pub mlx_version: String,
    /// The device computing.
    pub device: String,
    /// How the products compute.
    #[serde(flatten)]
    pub products: ProductPath,
}

/// Which arithmetic computes a model's products, for every report: the same
/// request on another machine gives the same numbers where these agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProductPath {
    /// How the weights are held: `native` (GGUF blocks as stored, on our
    /// CPU or GPU kernels) or `dequantized` (MLX's operations, the path that
    /// matches mlx-lm).
    pub weights: &'static str,
    /// With native weights on the CPU, how activations enter the products:
    /// `int8` or `f32`; `null` otherwise (on the GPU they stay in the
    /// compute dtype).
    pub activations: Option<&'static str>,
    /// The family of our CPU kernels that computes the products
    /// (`portable`, `avx2`, `avx512`; float32 activations always take the
    /// portable one); `null` where none of ours does (dequantized weights,
    /// the GPU).
    pub cpu_kernels: Option<&'static str>,
}

impl ProductPath {
    /// The path of weights held as `weights`, on the GPU or the CPU.
    pub fn of(weights: WeightStorage, gpu: bool) -> ProductPath {
        match weights {
            WeightStorage::Dequantized => ProductPath {
                weights: weights.name(),
                activations: None,
                cpu_kernels: None,
            },
            WeightStorage::Native(_) if gpu => ProductPath {
                weights: weights.name(),
                activations: None,
                cpu_kernels: None,
            },
            WeightStorage::Native(arithmetic) => ProductPath {
                weights: weights.name(),
                activations: Some(arithmetic.activations.name()),
                cpu_kernels: Some(arithmetic.effective_kernels().name()),
            },
        }
    }
}

/// A loaded model ready to generate.
#[derive(Debug)]
pub struct Engine {
    /// The model and its tokenizer and template.
    pub loaded: LoadedModel,
}

impl Engine {
    /// Wraps a loaded model.
    pub fn new(loaded: LoadedModel) -> Engine {
        Engine { loaded }
    }

    /// The tokenizer, or an error for models without one (random weights).
    pub fn tokenizer(&self) -> Result<&Tokenizer, GenerateError> {
        self.loaded.tokenizer.as_ref().ok_or_else(|| {
            GenerateError::Input(
                "this model has no tokenizer (random weights take token ids only)".into(),
            )
        })
    }

    /// Token ids of raw text: `<bos>` prepended, special-token text recognized.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, GenerateError> {
        Ok(self.tokenizer()?.encode(text, true)?)
    }

    /// Fresh caches for `options`' KV format.
    pub fn new_caches(&self, options: &GenerateOptions) -> Result<Vec<LayerCache>, GenerateError> {
        let caches = self
            .loaded
            .model
            .make_caches(options.cache_formats.clone())?;
        Ok(caches
            .into_iter()
            .map(|c| {
                c.quantize_from(options.kv_start as i32)
                    .round_queries(options.kv_queries)
            })
            .collect())
    }

    /// Completes raw text (with `<bos>` prepended) with a fresh cache.
    pub fn generate(
        &self,
        prompt: &str,
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent<'_>),
    ) -> Result<Generation, GenerateError> {
        let ids = self.tokenize(prompt)?;
        self.generate_ids(&ids, options, on_token)
    }

    /// Continues token ids with a fresh cache (greedy trajectories, random weights).
    pub fn generate_ids(
        &self,
        ids: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent<'_>),
    ) -> Result<Generation, GenerateError> {
        let mut caches = self.new_caches(options)?;
        generate(
            &self.loaded.model,
            self.loaded.tokenizer.as_ref(),
            ids,
            &mut caches,
            options,
            on_token,
        )
    }

    /// Renders `messages` with the chat template and generates the reply with
    /// a fresh cache (see [`crate::chat::ChatSession`] to reuse it across turns).
    pub fn chat(
        &self,
        messages: &[ChatMessage],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent<'_>),
    ) -> Result<Generation, GenerateError> {
        let prompt = self.loaded.chat_template.render(messages, true)?;
        let ids = self.tokenizer()?.encode(&prompt, false)?;
        self.generate_ids(&ids, options, on_token)
    }

    /// What the model is.
    pub fn metadata(&self) -> ModelMetadata {
        let model = &self.loaded.model;
        let c = &model.config;
        ModelMetadata {
            name: self.loaded.name.clone(),
            layers: c.num_hidden_layers,
            hidden_size: c.hidden_size,
            attention_heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            vocab_size: c.vocab_size,
            sliding_window: c.sliding_window,
            context_length: c.max_position_embeddings,
            parameters: c.parameters(),
            weight_bytes: model.weight_bytes(),
            dtype: model.dtype.name().to_string(),
            quantization: match (self.loaded.weight_quantization, model.gguf_block_types()) {
                (Some((bits, group)), _) => format!("{bits}-bit, group {group}"),
                (None, types) if types.is_empty() => "none".into(),
                (None, types) => {
                    let names: Vec<String> = types.iter().map(|t| format!("{t:?}")).collect();
                    format!("GGUF blocks as stored: {}", names.join(", "))
                }
            },
            mlx_version: device::mlx_version(),
            device: device::default_device()
                .map_or_else(|_| "unknown".into(), |d| d.name().to_string()),
            products: self.products(),
        }
    }

    /// How the model's products compute.
    pub fn products(&self) -> ProductPath {
        let gpu = device::default_device().is_ok_and(|d| d == device::Device::Gpu);
        ProductPath::of(self.loaded.weights, gpu)
    }
}
