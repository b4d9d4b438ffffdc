//! The Gemma 3 text forward pass, as mlx-lm 0.32.2's `gemma3_text.py` computes it.
//!
//! Per layer: `h = x + norm(attn(norm(x)))`, `out = h + norm(mlp(norm(h)))`,
//! with q/k RMSNorm after the head split and before RoPE, RoPE base 10000 on
//! sliding layers and `rope_theta` (linearly scaled where configured) on
//! global ones, grouped-query attention scaled by `query_pre_attn_scalar^-½`,
//! and a gated tanh-GELU MLP. RMSNorm weights arrive with the `1 +` already
//! folded in (done once by the loaders). The Q/K/V projections are one fused
//! matrix, as are the gate and up projections.

use mlx_core::device::{default_device, Device};
use mlx_core::fast::{rms_norm, scaled_dot_product_attention, AttentionMask};
use mlx_core::{Array, Dtype, Function};

use crate::cache::turbo::{rotate, unrotate};
use crate::cache::{
    Attend, CacheError, CacheFormat, KeyMask, KvCache, KvStore, LayerCache, RotatingKvCache,
};
use crate::config::Gemma3Config;
use crate::cpu_gelu;
use crate::cpu_layer::{self, decode_layer_cpu, CpuBlock};
use crate::cpu_prompt_attention::{self, RowMask};
use crate::kernels::{
    decode_attention_stored, decode_layer, grid_barrier, qk_norm_rope, resident_blocks,
    residual_norms, LayerGeometry, LayerWeights, Rotary,
};
use crate::kv_target::{FixedTarget, KvTarget};
use crate::linear::Linear;
use crate::weights::gguf::GgufDtype;

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

/// One transformer block's weights.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Pre-attention RMSNorm weight (1 + w).
    pub input_norm: Array,
    /// Fused `[q; k; v]` projection, `[(Hq + 2·Hkv)·D, hidden]`.
    pub qkv_proj: Linear,
    /// Output projection, `[hidden, Hq·D]`.
    pub o_proj: Linear,
    /// Per-head query RMSNorm weight (1 + w).
    pub q_norm: Array,
    /// Per-head key RMSNorm weight (1 + w).
    pub k_norm: Array,
    /// Post-attention RMSNorm weight (1 + w).
    pub post_attention_norm: Array,
    /// Pre-MLP RMSNorm weight (1 + w).
    pub pre_feedforward_norm: Array,
    /// Fused `[gate; up]` projection, `[2·intermediate, hidden]`.
    pub gate_up_proj: Linear,
    /// Down projection, `[hidden, intermediate]`.
    pub down_proj: Linear,
    /// Post-MLP RMSNorm weight (1 + w).
    pub post_feedforward_norm: Array,
}

impl Layer {
    /// Every weight array of the block.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.norms().to_vec();
        for p in self.projections() {
            out.extend(p.arrays());
        }
        out
    }

    /// The six norms' weights: input, q, k, post-attention, pre- and
    /// post-feedforward.
    pub fn norms(&self) -> [&Array; 6] {
        [
            &self.input_norm,
            &self.q_norm,
            &self.k_norm,
            &self.post_attention_norm,
            &self.pre_feedforward_norm,
            &self.post_feedforward_norm,
        ]
    }

    /// The four projections: Q/K/V, output, gate/up, down.
    pub fn projections(&self) -> [&Linear; 4] {
        [
            &self.qkv_proj,
            &self.o_proj,
            &self.gate_up_proj,
            &self.down_proj,
        ]
    }

    /// The block's weights as [`decode_layer`] takes them; `None` when a
    /// projection is quantized.
    pub fn dense_weights(&self) -> Option<LayerWeights<'_>> {
        let (Linear::Dense(qkv), Linear::Dense(o), Linear::Dense(gate_up), Linear::Dense(down)) = (
            &self.qkv_proj,
            &self.o_proj,
            &self.gate_up_proj,
            &self.down_proj,
        ) else {
            return None;
        };
        Some(LayerWeights {
            input_norm: &self.input_norm,
            qkv,
            q_norm: &self.q_norm,
            k_norm: &self.k_norm,
            o,
            post_attention_norm: &self.post_attention_norm,
            pre_feedforward_norm: &self.pre_feedforward_norm,
            gate_up,
            down,
            post_feedforward_norm: &self.post_feedforward_norm,
        })
    }
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
    /// Whether to run our GPU kernels of [`crate::kernels`] when computing on
    /// the GPU (off by default: MLX's own operations): one kernel per block
    /// in fixed-shape decode steps, smaller fused kernels otherwise.
    pub gpu_kernels: bool,
}

impl Gemma3 {
    /// One cache per layer: rotating (window-sized) for sliding layers, plain
    /// for global ones, all storing keys and values in `format`.
    pub fn make_caches(&self, format: CacheFormat) -> Result<Vec<LayerCache>, ModelError> {
        let dim = self.config.head_dim as i32;
        format.keys.validate(dim)?;
        format.values.validate(dim)?;
        (0..self.config.num_hidden_layers)
            .map(|i| {
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

    /// Logits `[B, L, vocab]` for token ids `[B, L]` (int32) following what
    /// `caches` hold; the caches take the new tokens.
    pub fn forward(&self, tokens: &Array, caches: &mut [LayerCache]) -> Result<Array, ModelError> {
        let h = self.hidden(tokens, caches)?;
        self.logits(&h)
    }

    /// Whether a forward pass runs our GPU kernels now ([`Gemma3::gpu_kernels`]
    /// and the default device is the GPU).
    pub fn runs_gpu_kernels(&self) -> mlx_core::Result<bool> {
        Ok(self.placement()?.kernels)
    }

    /// Where a forward pass computes now: on the default device, with our
    /// kernels if asked for and on the GPU.
    fn placement(&self) -> mlx_core::Result<Placement> {
        Placement::current(self.gpu_kernels)
    }

    /// The final normalized hidden states `[B, L, hidden]`.
    pub fn hidden(&self, tokens: &Array, caches: &mut [LayerCache]) -> Result<Array, ModelError> {
        let mut targets: Vec<KvTarget<'_>> = caches.iter_mut().map(KvTarget::Cache).collect();
        self.hidden_with(tokens, &mut targets)
    }

    /// Logits of final normalized hidden states `[B, L, hidden]` (the tied
    /// embedding).
    pub fn logits(&self, hidden: &Array) -> Result<Array, ModelError> {
        Ok(self.embed.forward_with(hidden, self.placement()?.kernels)?)
    }

    /// [`Gemma3::hidden`] with each layer's keys and values going to `targets`.
    pub(crate) fn hidden_with(
        &self,
        tokens: &Array,
        targets: &mut [KvTarget<'_>],
    ) -> Result<Array, ModelError> {
        if targets.len() != self.layers.len() {
            return Err(ModelError::Input(format!(
                "{} caches given for {} layers",
                targets.len(),
                self.layers.len()
            )));
        }
        if tokens.ndim() != 2 {
            return Err(ModelError::Input(format!(
                "token ids must be [batch, length], got {:?}",
                tokens.shape()
            )));
        }
        let mut h = self.embed.rows(tokens)?;
        if h.dtype() != self.dtype {
            h = h.astype(self.dtype)?;
        }
        // mlx-lm rounds the scale through bfloat16 before multiplying.
        let scale = Array::scalar((self.config.hidden_size as f64).sqrt(), Dtype::Bfloat16)?
            .astype(self.dtype)?;
        h = h.multiply(&scale)?;
        let Some(first) = self.layers.first() else {
            return Ok(rms_norm(&h, Some(&self.norm), self.config.rms_norm_eps)?);
        };
        let place = self.placement()?;
        if place.kernels {
            if let Some(normed) = self.fused_blocks(&h, targets)? {
                return Ok(normed);
            }
        } else if !place.gpu {
            if let Some(normed) = self.cpu_blocks(&h, targets)? {
                return Ok(normed);
            }
        }
        let mut normed = rms_norm(&h, Some(&first.input_norm), self.config.rms_norm_eps)?;
        for (i, (layer, target)) in self.layers.iter().zip(targets.iter_mut()).enumerate() {
            let next_norm = self.layers.get(i + 1).map_or(&self.norm, |l| &l.input_norm);
            (h, normed) = self.block(i, layer, (&h, &normed), next_norm, target, place)?;
        }
        Ok(normed)
    }

    /// The final normalized hidden state of one token `h` (embedded) through
    /// every block as one GPU kernel each ([`decode_layer`]), the blocks
    /// writing into fixed-shape targets; `None` where some block does not
    /// suit the kernel (nothing has run then: the graph is lazy).
    fn fused_blocks(
        &self,
        h: &Array,
        targets: &[KvTarget<'_>],
    ) -> Result<Option<Array>, ModelError> {
        let barrier = grid_barrier()?;
        let blocks = resident_blocks()?;
        self.kernel_blocks(h, targets, |i, layer, fixed, x| {
            let Some(weights) = layer.dense_weights() else {
                return Ok(None);
            };
            let geometry = self.layer_geometry(i);
            Ok(decode_layer(
                x,
                &weights,
                &fixed.layer_kv(),
                geometry,
                &barrier,
                blocks,
            )?)
        })
    }

    /// The final normalized hidden state of one token `h` (embedded,
    /// `[1, 1, H]`, float32) through every block as operations of ours on
    /// the CPU (`cpu_layer.rs`), each block's key and value going to its
    /// target in the target's format: one operation per block where the
    /// target is a compiled step's float32 buffers, three otherwise (the
    /// eager pass, compressed stores), with the same arithmetic, so that the
    /// eager pass and the compiled step give the same logits. `None` where
    /// some block does not suit them (nothing has run then: the graph is
    /// lazy).
    fn cpu_blocks(
        &self,
        h: &Array,
        targets: &mut [KvTarget<'_>],
    ) -> Result<Option<Array>, ModelError> {
        let hidden = self.config.hidden_size as i32;
        if h.shape() != [1, 1, hidden] || h.dtype() != Dtype::Float32 {
            return Ok(None);
        }
        let mut blocks = Vec::with_capacity(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            match CpuBlock::of(layer, self.layer_geometry(i))? {
                Some(block) => blocks.push(block),
                None => return Ok(None),
            }
        }
        let mut x = h.clone();
        for (block, target) in blocks.iter().zip(targets.iter_mut()) {
            if let KvTarget::Fixed(fixed) = target {
                let kv = fixed.layer_kv();
                if let Some(out) = decode_layer_cpu(&x, block.layer, &kv, block.geometry)? {
                    x = out;
                    continue;
                }
            }
            x = cpu_block_in_parts(block, &x, target)?;
        }
        Ok(Some(rms_norm(
            &x,
            Some(&self.norm),
            self.config.rms_norm_eps,
        )?))
    }

    /// The final normalized hidden state of one token `h` through every
    /// block as one GPU kernel each: `block(i, layer, target, x)` makes block
    /// `i`'s output from its input `x`, writing into the fixed-shape
    /// `target`, or says `None` where the block does not suit its kernel;
    /// then this is `None` too (nothing has run: the graph is lazy).
    fn kernel_blocks(
        &self,
        h: &Array,
        targets: &[KvTarget<'_>],
        mut block: impl FnMut(
            usize,
            &Layer,
            &FixedTarget<'_>,
            &Array,
        ) -> Result<Option<Array>, ModelError>,
    ) -> Result<Option<Array>, ModelError> {
        let mut x = h.clone();
        for (i, (layer, target)) in self.layers.iter().zip(targets).enumerate() {
            let KvTarget::Fixed(fixed) = target else {
                return Ok(None);
            };
            match block(i, layer, fixed, &x)? {
                Some(out) => x = out,
                None => return Ok(None),
            }
        }
        Ok(Some(rms_norm(
            &x,
            Some(&self.norm),
            self.config.rms_norm_eps,
        )?))
    }

    /// Whether the compiled decode step runs every block as one CPU
    /// operation of ours on the CPU (`cpu_layer.rs`): each block's
    /// projections are on our CPU kernels (weights as stored, 8-bit
    /// activations or GGUF blocks) and the model computes in float32.
    pub fn has_cpu_layers(&self) -> mlx_core::Result<bool> {
        if self.dtype != Dtype::Float32 || self.layers.is_empty() {
            return Ok(false);
        }
        for layer in &self.layers {
            if !cpu_layer::runs(layer)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The head layout and constants of block `index`, as
    /// [`decode_layer`] takes them.
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
    fn rope_of(&self, index: usize) -> (f32, f32) {
        let c = &self.config;
        if c.is_sliding(index) {
            (c.rope_local_base_freq, 1.0)
        } else {
            (c.rope_theta, 1.0 / c.rope_scaling.unwrap_or(1.0))
        }
    }

    /// One block on `x` and its input norm `x_normed`: returns the block's
    /// output and that output normed with `next_norm` (the next block's
    /// input norm, or the final norm).
    fn block(
        &self,
        index: usize,
        layer: &Layer,
        (x, x_normed): (&Array, &Array),
        next_norm: &Array,
        target: &mut KvTarget<'_>,
        place: Placement,
    ) -> Result<(Array, Array), ModelError> {
        let eps = self.config.rms_norm_eps;
        let fused = place.kernels;
        let r = self.attention(index, layer, x_normed, target, place)?;
        let (h, h_normed) = residual_norms(
            x,
            &r,
            &layer.post_attention_norm,
            &layer.pre_feedforward_norm,
            eps,
            fused,
        )?;
        let r = self.mlp(layer, &h_normed, place)?;
        Ok(residual_norms(
            &h,
            &r,
            &layer.post_feedforward_norm,
            next_norm,
            eps,
            fused,
        )?)
    }

    fn mlp(&self, layer: &Layer, x: &Array, place: Placement) -> Result<Array, ModelError> {
        let fused = place.kernels;
        let inter = self.config.intermediate_size as i32;
        let parts = layer
            .gate_up_proj
            .forward_parts(x, &[inter, inter], fused)?;
        let [gate, up] = parts.as_slice() else {
            return Err(ModelError::Input(
                "gate/up projection gave the wrong parts".into(),
            ));
        };
        let gated = match place.gpu {
            false => cpu_gelu::gated_gelu(gate, up)?,
            true => None,
        };
        let gated = match gated {
            Some(g) => g,
            None => gated_gelu(gate, up)?,
        };
        Ok(layer.down_proj.forward_with(&gated, fused)?)
    }

    fn attention(
        &self,
        index: usize,
        layer: &Layer,
        x: &Array,
        target: &mut KvTarget<'_>,
        place: Placement,
    ) -> Result<Array, ModelError> {
        let c = &self.config;
        let fused = place.kernels;
        let (hq, hkv, d) = (
            c.num_attention_heads as i32,
            c.num_key_value_heads as i32,
            c.head_dim as i32,
        );
        let shape = x.shape();
        let (b, l) = (shape[0], shape[1]);
        let parts = layer
            .qkv_proj
            .forward_parts(x, &[hq * d, hkv * d, hkv * d], fused)?;
        let [q, k, v] = parts.as_slice() else {
            return Err(ModelError::Input(
                "q/k/v projection gave the wrong parts".into(),
            ));
        };
        let (base, scale) = self.rope_of(index);
        let rotary = Rotary {
            offset: target.rope_offset(),
            base,
            scale,
        };
        let (q, k) = qk_norm_rope(
            q,
            k,
            (&layer.q_norm, &layer.k_norm),
            (hq, hkv, d),
            rotary,
            c.rms_norm_eps,
            fused,
        )?;
        let v = v.reshape(&[b, l, hkv, d])?.transpose(&[0, 2, 1, 3])?;
        let attend = target.update(&k, &v)?;
        let mut out = attend_to(&q, &attend, c.attention_scale(), place)?;
        if out.dtype() != q.dtype() {
            // Keys or values of another float dtype (a float16 cache under a
            // bfloat16 model) promote attention to float32: the residual
            // stream stays in the compute dtype.
            out = out.astype(q.dtype())?;
        }
        let out = out.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, hq * d])?;
        Ok(layer.o_proj.forward_with(&out, fused)?)
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

/// One token `x` (`[1, 1, H]`) through `block` as three CPU operations of
/// ours ([`CpuBlock`]): Q/K/V, then the key and value stored in `target` in
/// its format and attention over what it returns (decoded to float32;
/// TurboQuant in its rotated domain, the queries rotated alike and the
/// output rotated back), then the rest of the block.
fn cpu_block_in_parts(
    block: &CpuBlock<'_>,
    x: &Array,
    target: &mut KvTarget<'_>,
) -> Result<Array, ModelError> {
    let g = block.geometry;
    let (hq, hkv, d) = (g.heads, g.kv_heads, g.head_dim);
    let position = match target {
        KvTarget::Cache(c) => Array::from_slice(&[c.offset()], &[1])?,
        KvTarget::Fixed(f) => f.position.clone(),
    };
    let qkv = block.queries_keys_values(x, &position)?;
    let part = |start: i32, len: i32| qkv.slice(&[0, 0, start], &[1, 1, start + len], &[1, 1, 1]);
    let heads = |a: Array| a.reshape(&[1, 1, hkv, d])?.transpose(&[0, 2, 1, 3]);
    let q = part(0, hq * d)?;
    let (k, v) = (
        heads(part(hq * d, hkv * d)?)?,
        heads(part((hq + hkv) * d, hkv * d)?)?,
    );
    let attend = target.update(&k, &v)?;
    let valid = match &attend.mask {
        KeyMask::All => Array::from_slice(&[attend.keys.positions()], &[1])?,
        KeyMask::Leading { valid, .. } => valid.clone(),
        KeyMask::Causal | KeyMask::Array(_) => {
            return Err(ModelError::Input(
                "one token's attention was handed a mask of several queries".into(),
            ))
        }
    };
    let (turbo_keys, turbo_values) = (
        matches!(attend.keys, KvStore::Turbo(_)),
        matches!(attend.values, KvStore::Turbo(_)),
    );
    let q = if turbo_keys {
        rotate(&q.reshape(&[1, hq, d])?)?.reshape(&[1, 1, hq * d])?
    } else {
        q
    };
    let float32 = |store: &KvStore| -> Result<Array, ModelError> {
        let a = decode_turbo(store, Dtype::Float32)?.decoded(Dtype::Float32)?;
        Ok(if a.dtype() == Dtype::Float32 {
            a
        } else {
            a.astype(Dtype::Float32)?
        })
    };
    let (keys, values) = (float32(&attend.keys)?, float32(&attend.values)?);
    let out = block.attention(&q, &keys, &values, &valid)?;
    let out = if turbo_values {
        unrotate(&out.reshape(&[1, hq, d])?)?.reshape(&[1, 1, hq * d])?
    } else {
        out
    };
    Ok(block.finish(x, &out)?)
}

/// Where a forward pass computes, decided once per pass.
#[derive(Debug, Clone, Copy)]
struct Placement {
    /// On the GPU.
    gpu: bool,
    /// With our GPU kernels ([`crate::kernels`]).
    kernels: bool,
}

impl Placement {
    /// On the default device, with our kernels if asked for and on the GPU.
    fn current(gpu_kernels: bool) -> mlx_core::Result<Placement> {
        let gpu = default_device()? == Device::Gpu;
        Ok(Placement {
            gpu,
            kernels: gpu && gpu_kernels,
        })
    }
}

/// mlx's `gelu_approx`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
fn gelu_approx(x: &Array) -> mlx_core::Result<Array> {
    let dtype = x.dtype();
    let c = |v: f64| Array::scalar(v, dtype);
    let inner = x
        .add(&x.power(&c(3.0)?)?.multiply(&c(0.044715)?)?)?
        .multiply(&c((2.0 / std::f64::consts::PI).sqrt())?)?;
    x.multiply(&c(0.5)?)?
        .multiply(&inner.tanh()?.add(&c(1.0)?)?)
}

thread_local! {
    /// `gelu_approx(gate) · up` compiled (shapeless) into one fused kernel,
    /// once per thread: MLX's compile caches are per thread. mlx-lm compiles
    /// `gelu_approx` the same way.
    static GATED_GELU: Result<Function, String> = Function::new(|xs: &[Array]| match xs {
        [gate, up] => Ok(vec![gelu_approx(gate)?.multiply(up)?]),
        _ => Err(mlx_core::Error::Host(format!("gated GELU takes 2 arrays, got {}", xs.len()))),
    })
    .and_then(|f| f.compile(true))
    .map_err(|e| e.to_string());
}

/// `gelu_approx(gate) · up` through the compiled kernel.
fn gated_gelu(gate: &Array, up: &Array) -> Result<Array, ModelError> {
    GATED_GELU.with(|f| {
        let f = f
            .as_ref()
            .map_err(|e| ModelError::Input(format!("compiling the gated GELU: {e}")))?;
        f.call(&[gate, up])?
            .pop()
            .ok_or_else(|| ModelError::Input("the gated GELU returned nothing".into()))
    })
}

/// Attention of queries `[B, Hq, L, D]` (RoPE applied, unscaled) over what
/// a cache returned, on the default device; `gpu_kernels` lets it use our
/// GPU kernels there. The eager forward pass attends through this.
pub fn cache_attention(
    q: &Array,
    attend: &Attend,
    scale: f32,
    gpu_kernels: bool,
) -> Result<Array, ModelError> {
    attend_to(q, attend, scale, Placement::current(gpu_kernels)?)
}

/// Attention of queries `[B, Hq, L, D]` over what a cache returned.
///
/// TurboQuant keys and values are decoded in their rotated domain: the
/// queries are rotated the same way when keys are (the rotation is
/// orthogonal, so the scores are those of the original vectors), and the
/// output is rotated back when values are.
///
/// Affine-quantized keys and values are read packed by our decode attention
/// kernel where it takes them, and dequantized for MLX's attention
/// elsewhere: MLX's CPU `quantized_matmul` is a scalar loop several times
/// slower than BLAS, and its CUDA one broadcast over grouped-query heads
/// (more than one key/value head) gave outputs 1.4× the output's size away
/// from the attention of the dequantized vectors on the H200 (MLX 0.32.4),
/// and compiled for about a minute on first use.
///
/// One query over float or TurboQuant keys and values runs through our
/// decode attention kernels on the GPU with our kernels on, and always for
/// the leading-keys mask of the compiled decode step: MLX's masked attention there costs more than the
/// eager pass saves (1B step at context 128 on the H200: 8.1 ms against
/// 7.2 ms eager).
fn attend_to(
    q: &Array,
    attend: &Attend,
    scale: f32,
    place: Placement,
) -> Result<Array, ModelError> {
    let (turbo_keys, turbo_values) = (
        matches!(attend.keys, KvStore::Turbo(_)),
        matches!(attend.values, KvStore::Turbo(_)),
    );
    let queries = if turbo_keys { rotate(q)? } else { q.clone() };
    let finish = |out: Array| -> Result<Array, ModelError> {
        Ok(if turbo_values { unrotate(&out)? } else { out })
    };
    if place.gpu {
        let valid = match &attend.mask {
            KeyMask::All if place.kernels => {
                Some(Array::from_slice(&[attend.keys.positions()], &[1])?)
            }
            KeyMask::Leading { valid, .. } => Some(valid.clone()),
            KeyMask::All | KeyMask::Causal | KeyMask::Array(_) => None,
        };
        if let Some(valid) = valid {
            let stored =
                decode_attention_stored(&queries, &attend.keys, &attend.values, &valid, scale)?;
            if let Some(out) = stored {
                return finish(out);
            }
        }
    }
    if turbo_keys || turbo_values {
        let decoded = Attend {
            keys: decode_turbo(&attend.keys, q.dtype())?,
            values: decode_turbo(&attend.values, q.dtype())?,
            mask: attend.mask.clone(),
        };
        return finish(attend_to(&queries, &decoded, scale, place)?);
    }
    let (keys, values) = (
        attend.keys.decoded(q.dtype())?,
        attend.values.decoded(q.dtype())?,
    );
    if !place.gpu && q.dim(2)? > 1 {
        if let Some(mask) = prompt_mask(&attend.mask, q, &keys, &values)? {
            return Ok(cpu_prompt_attention::attend(
                q, &keys, &values, scale, mask,
            )?);
        }
    }
    let mask = match &attend.mask {
        KeyMask::All => AttentionMask::None,
        KeyMask::Causal => AttentionMask::Causal,
        KeyMask::Array(m) => AttentionMask::Array(m),
        KeyMask::Leading { additive, .. } => AttentionMask::Array(additive),
    };
    Ok(scaled_dot_product_attention(
        q, &keys, &values, scale, mask,
    )?)
}

/// The mask of a prompt chunk's attention on the CPU through
/// [`cpu_prompt_attention`]: float32 queries, keys and values, and a mask
/// of every key, the causal one, or a boolean `[queries, keys]` array;
/// `None` otherwise (MLX's attention takes the rest).
fn prompt_mask<'a>(
    mask: &'a KeyMask,
    q: &Array,
    keys: &Array,
    values: &Array,
) -> mlx_core::Result<Option<RowMask<'a>>> {
    if [q, keys, values]
        .iter()
        .any(|a| a.dtype() != Dtype::Float32)
    {
        return Ok(None);
    }
    Ok(match mask {
        KeyMask::All => Some(RowMask::All),
        KeyMask::Causal => Some(RowMask::Causal),
        KeyMask::Array(m) if m.dtype() == Dtype::Bool && m.shape() == [q.dim(2)?, keys.dim(2)?] => {
            Some(RowMask::Array(m))
        }
        KeyMask::Array(_) | KeyMask::Leading { .. } => None,
    })
}

/// A TurboQuant store as floats in its rotated domain; any other as it is.
fn decode_turbo(store: &KvStore, dtype: Dtype) -> Result<KvStore, CacheError> {
    Ok(match store {
        KvStore::Turbo(t) => KvStore::Float(t.decode_rotated(dtype)?),
        other => other.clone(),
    })
}
