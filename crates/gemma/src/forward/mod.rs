//! The Gemma 3 text forward pass, as mlx-lm 0.32.2's `gemma3_text.py` computes it.
//!
//! Per layer: `h = x + norm(attn(norm(x)))`, `out = h + norm(mlp(norm(h)))`,
//! with q/k RMSNorm after the head split and before RoPE, RoPE base 10000 on
//! sliding layers and `rope_theta` (linearly scaled where configured) on
//! global ones, grouped-query attention scaled by `query_pre_attn_scalar^-½`,
//! and a gated tanh-GELU MLP. RMSNorm weights arrive with the `1 +` already
//! folded in (done once by the loaders). The Q/K/V projections are one fused
//! matrix, as are the gate and up projections.
//!
//! This is where the devices meet: each pass computes with MLX's operations
//! where no kernel of ours applies, with the CPU's (`crate::cpu`) or the
//! GPU's (`crate::cuda`) where they do, chosen per pass by `Placement`.
//! The model's data (`crate::model`) and the devices' kernels lie below it;
//! the compiled decode step ([`decode_step`]) drives it with fixed-shape
//! targets (`kv_target`).

mod attention;
pub mod decode_step;
pub(crate) mod kv_target;
mod placement;
mod query_rounding;

use mlx_core::fast::rms_norm;
use mlx_core::{Array, Dtype, Function};

use crate::cache::turbo::{rotate, unrotate};
use crate::cache::{KeyMask, KvStore, LayerCache};
use crate::cpu::gelu as cpu_gelu;
use crate::cpu::layer::{self as cpu_layer, decode_layer_cpu, CpuBlock};
use crate::cuda::{decode_layer, grid_barrier, resident_blocks, LayerWeights, Rotary};
use crate::model::{Gemma3, Layer, ModelError};
pub use attention::cache_attention;
use attention::{attend_to, decode_turbo};
use kv_target::{FixedTarget, KvTarget};
use placement::Placement;

impl Gemma3 {
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
        Ok(self
            .embed
            .forward_with(hidden, self.placement()?.products())?)
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
        let place = self.placement()?;
        let mut h = self.embed.rows_with(tokens, place.products(), self.dtype)?;
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
        if place.kernels {
            if let Some(normed) = self.fused_blocks(&h, targets)? {
                return Ok(normed);
            }
        } else if !place.gpu {
            if let Some(normed) = self.cpu_blocks(&h, targets)? {
                return Ok(normed);
            }
        }
        // Past the one-token paths: whether a chunk's norms run on our CPU
        // operations is asked only here, not on every decoded token.
        let place = Placement {
            cpu_rows: !place.gpu && self.has_cpu_layers()?,
            ..place
        };
        let mut normed = rms_norm(&h, Some(&first.input_norm), self.config.rms_norm_eps)?;
        // Several tokens over GGUF blocks on the GPU dequantize each
        // projection for its product: evaluated a block at a time, so that
        // only one block's dequantized matrices are held at once (a whole
        // 12B prompt chunk's graph held 21.7 GB for a 7.3 GB file).
        let by_block = place.gpu && tokens.dim(1)? > 1;
        for (i, (layer, target)) in self.layers.iter().zip(targets.iter_mut()).enumerate() {
            let next_norm = self.layers.get(i + 1).map_or(&self.norm, |l| &l.input_norm);
            (h, normed) = self.block(i, layer, (&h, &normed), next_norm, target, place)?;
            if by_block
                && layer
                    .projections()
                    .iter()
                    .any(|p| !p.gguf_types().is_empty())
            {
                mlx_core::eval(&[&h, &normed])?;
            }
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
            let geometry = self.layer_geometry(i);
            let Some(weights) = LayerWeights::of(layer, geometry, self.dtype)? else {
                return Ok(None);
            };
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
    /// the CPU (`crate::cpu::layer`), each block's key and value going to its
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
    /// operation of ours on the CPU (`crate::cpu::layer`): each block's
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
        let r = self.attention(index, layer, x_normed, target, place)?;
        let (h, h_normed) = place.residual_norms(
            x,
            &r,
            (&layer.post_attention_norm, &layer.pre_feedforward_norm),
            eps,
        )?;
        let r = self.mlp(layer, &h_normed, place)?;
        Ok(place.residual_norms(&h, &r, (&layer.post_feedforward_norm, next_norm), eps)?)
    }

    fn mlp(&self, layer: &Layer, x: &Array, place: Placement) -> Result<Array, ModelError> {
        let inter = self.config.intermediate_size as i32;
        let parts = layer
            .gate_up_proj
            .forward_parts(x, &[inter, inter], place.products())?;
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
        Ok(layer.down_proj.forward_with(&gated, place.products())?)
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
        let (hq, hkv, d) = (
            c.num_attention_heads as i32,
            c.num_key_value_heads as i32,
            c.head_dim as i32,
        );
        let shape = x.shape();
        let (b, l) = (shape[0], shape[1]);
        let parts =
            layer
                .qkv_proj
                .forward_parts(x, &[hq * d, hkv * d, hkv * d], place.products())?;
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
        let (q, k) = place.qk_norm_rope(
            (q, k),
            (&layer.q_norm, &layer.k_norm),
            (hq, hkv, d),
            rotary,
            c.rms_norm_eps,
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
        Ok(layer.o_proj.forward_with(&out, place.products())?)
    }
}

/// One token `x` (`[1, 1, H]`) through `block` as three CPU operations of
/// ours ([`CpuBlock`]): Q/K/V, then the key and value stored in `target` in
/// its format and attention over what it returns (decoded to float32;
/// TurboQuant in its rotated domain, and a cache's Hadamard rotation, the
/// queries rotated alike and the output rotated back), then the rest of the
/// block.
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
    let q = attend
        .rotation
        .keys_side(&q.reshape(&[1, hq, d])?)?
        .reshape(&[1, 1, hq * d])?;
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
    let out = attend
        .rotation
        .values_side(&out.reshape(&[1, hq, d])?)?
        .reshape(&[1, 1, hq * d])?;
    Ok(block.finish(x, &out)?)
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
