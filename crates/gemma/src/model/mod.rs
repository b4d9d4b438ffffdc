//! A Gemma 3 text model as plain data: its configuration, its weights
//! ([`Gemma3`], [`Layer`]) and what follows from them (each block's head
//! layout, its caches). How a forward pass computes over them, on each
//! device, is `crate::forward`'s.

mod layer;

use mlx_core::{Array, Dtype};

use crate::cache::{CacheError, KvCache, LayerCache, LayerFormats, RotatingKvCache};
use crate::config::Gemma3Config;
use crate::linear::Linear;
use crate::quant::GgufDtype;
pub use layer::{Layer, LayerGeometry};

/// Errors of the forward pass.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// A cache operation failed.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The caller passed something the model cannot take.
    #[error("{0}")]
    Input(String),
}

/// A loaded Gemma 3 text model.
#[derive(Debug, Clone)]
pub struct Gemma3 {
    /// The hyperparameters.
    pub config: Gemma3Config,
    /// The compute dtype of activations.
    pub dtype: Dtype,
    /// Token embeddings `[vocab, hidden]`, also the (tied) output projection.
    pub embed: Linear,
    /// The transformer blocks.
    pub layers: Vec<Layer>,
    /// Final RMSNorm weight (1 + w).
    pub norm: Array,
    /// Whether to run our GPU kernels of [`crate::cuda`] when computing on
    /// the GPU (off by default: MLX's own operations): one kernel per block
    /// in fixed-shape decode steps, smaller fused kernels otherwise.
    pub gpu_kernels: bool,
}

impl Gemma3 {
    /// One cache per layer: rotating (window-sized) for sliding layers, plain
    /// for global ones, each storing keys and values in the format `formats`
    /// gives its layer.
    pub fn make_caches(
        &self,
        formats: impl Into<LayerFormats>,
    ) -> Result<Vec<LayerCache>, ModelError> {
        let formats = formats.into();
        let dim = self.config.head_dim as i32;
        let layers = self.config.num_hidden_layers;
        (0..layers)
            .map(|i| {
                let format = formats.of(i, layers)?;
                format.validate(dim)?;
                Ok(if self.config.is_sliding(i) {
                    LayerCache::Rotating(RotatingKvCache::new(
                        self.config.sliding_window as i32,
                        format,
                    )?)
                } else {
                    LayerCache::Plain(KvCache::new(format))
                })
            })
            .collect()
    }

    /// The head layout and constants of block `index`, as the devices'
    /// decode blocks take them.
    pub fn layer_geometry(&self, index: usize) -> LayerGeometry {
        let c = &self.config;
        let (rope_base, rope_scale) = self.rope_of(index);
        LayerGeometry {
            heads: c.num_attention_heads as i32,
            kv_heads: c.num_key_value_heads as i32,
            head_dim: c.head_dim as i32,
            eps: c.rms_norm_eps,
            scale: c.attention_scale(),
            rope_base,
            rope_scale,
        }
    }

    /// RoPE's frequency base and position multiplier of layer `index`.
    pub(crate) fn rope_of(&self, index: usize) -> (f32, f32) {
        let c = &self.config;
        if c.is_sliding(index) {
            (c.rope_local_base_freq, 1.0)
        } else {
            (c.rope_theta, 1.0 / c.rope_scaling.unwrap_or(1.0))
        }
    }

    /// Bytes held by the weights.
    pub fn weight_bytes(&self) -> usize {
        self.arrays().iter().map(|a| a.nbytes()).sum()
    }

    /// The GGUF block types held as stored, each once, in the order met
    /// (embedding first); empty when no weight is.
    pub fn gguf_block_types(&self) -> Vec<GgufDtype> {
        let mut types = self.embed.gguf_types();
        for l in &self.layers {
            for p in l.projections() {
                types.extend(p.gguf_types());
            }
        }
        let mut seen = Vec::new();
        for t in types {
            if !seen.contains(&t) {
                seen.push(t);
            }
        }
        seen
    }

    /// Every weight array.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.embed.arrays();
        out.push(&self.norm);
        for l in &self.layers {
            out.extend(l.arrays());
        }
        out
    }
}
