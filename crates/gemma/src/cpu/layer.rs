//! A decoder block for one token as operations of ours on the CPU.
//!
//! MLX's CPU backend spends host time on every operation (building the
//! graph, handing each operation to its stream thread), and a block decoded
//! as MLX operations is about 35 of them: with the projections already on
//! our kernels, that overhead was more than half of a token of the default
//! model (docs/performance.md). Here the block runs in three parts, each
//! one CPU operation of ours on rayon's pool, its projections on our block
//! kernels ([`crate::quant::rows_times`], [`crate::linear::affine`]):
//! Q/K/V ([`queries_keys_values`]: the input norm, the projection, the q/k
//! norms and RoPE), attention over float32 keys and values
//! ([`attention`]), and the rest ([`finish`]: the output projection, the
//! residual norms and the gated MLP). Between them the caller stores the
//! new key and value in the cache, in its format, and decodes what
//! attention reads. Where the stores are float32 buffers of a compiled
//! step, [`decode_layer_cpu`] runs the three parts and the store as one
//! operation, writing the key and value in place.
//!
//! Both ways compute the same thing in the same order, so the eager pass
//! and the compiled step give the same bits. They compute in float32 as the
//! eager MLX operations do on the CPU; only the order of additions differs
//! from those.

use std::sync::Arc;

use mlx_core::cpu_kernel::{
    cpu_kernel, cpu_kernel_in_place, floats, floats_mut, CpuKernelFn, CpuKernelInPlaceFn,
};
use mlx_core::{Array, Dtype};

use super::attention::{attend, Heads};
use super::gelu::gated_gelu_into;
use super::norms::{rms_norm, rms_norm_in_place, RopeTable};
use crate::cache::{KvStore, LayerKv};
use crate::linear::projection::Projection;
use crate::model::{Layer, LayerGeometry};

/// Whether every projection of `layer` is on our CPU kernels and its norms
/// are float32, so that the block runs as operations of ours.
pub(crate) fn runs(layer: &Layer) -> mlx_core::Result<bool> {
    Ok(norms_are_float32(layer) && projections(layer, &mut Vec::new())?.is_some())
}

fn norms_are_float32(layer: &Layer) -> bool {
    layer.norms().iter().all(|n| n.dtype() == Dtype::Float32)
}

/// The block's Q/K/V, output, gate/up and down projections, pushing the
/// arrays they read onto `arrays`; `None` where one is not on our CPU
/// kernels.
fn projections<'a>(
    layer: &'a Layer,
    arrays: &mut Vec<&'a Array>,
) -> mlx_core::Result<Option<[Projection; 4]>> {
    let mut out = Vec::with_capacity(4);
    for linear in layer.projections() {
        match Projection::of(linear, arrays)? {
            Some(p) => out.push(p),
            None => return Ok(None),
        }
    }
    Ok(<[Projection; 4]>::try_from(out).ok())
}

/// The block's shapes and constants, and its projections.
#[derive(Debug, Clone)]
struct Block {
    geometry: LayerGeometry,
    hidden: usize,
    intermediate: usize,
    /// Q/K/V, output, gate/up and down.
    projections: [Projection; 4],
}

impl Block {
    /// The block of `layer`, pushing the arrays its projections read onto
    /// `arrays`; `None` where it does not suit our operations.
    fn of<'a>(
        layer: &'a Layer,
        geometry: LayerGeometry,
        arrays: &mut Vec<&'a Array>,
    ) -> mlx_core::Result<Option<Block>> {
        if !norms_are_float32(layer) {
            return Ok(None);
        }
        let Some(projections) = projections(layer, arrays)? else {
            return Ok(None);
        };
        let hidden = layer.input_norm.size();
        let (hq, hkv, d) = (
            geometry.heads as usize,
            geometry.kv_heads as usize,
            geometry.head_dim as usize,
        );
        let intermediate = projections[2].rows() / 2;
        let rows_fit = projections[0].rows() == (hq + 2 * hkv) * d
            && projections[1].rows() == hidden
            && projections[2].rows() == 2 * intermediate
            && projections[3].rows() == hidden;
        Ok(rows_fit.then_some(Block {
            geometry,
            hidden,
            intermediate,
            projections,
        }))
    }

    /// The heads' layout.
    fn heads(&self) -> Heads {
        Heads {
            query: self.geometry.heads as usize,
            kv: self.geometry.kv_heads as usize,
            dim: self.geometry.head_dim as usize,
        }
    }

    /// Values of Q, K and V together.
    fn qkv_len(&self) -> usize {
        let h = self.heads();
        (h.query + 2 * h.kv) * h.dim
    }

    /// The token `x`'s queries, key and value, one after another: the input
    /// norm (`norms[0]`), the Q/K/V projection over `weights`, the q and k
    /// norms (`norms[1]`, `norms[2]`) and RoPE at `position`.
    fn queries_keys_values(
        &self,
        x: &[f32],
        norms: [&[f32]; 3],
        position: i32,
        weights: &[&[u8]],
    ) -> Result<Vec<f32>, String> {
        let g = &self.geometry;
        let h = self.heads();
        let [w_in, q_norm, k_norm] = norms;
        let normed = rms_norm(x, w_in, g.eps);
        let mut qkv = vec![0f32; self.qkv_len()];
        self.projections[0].apply(weights, &normed, &mut qkv)?;
        let rope = RopeTable::new(position as f32 * g.rope_scale, g.rope_base, h.dim);
        let (q, kv) = qkv.split_at_mut(h.query * h.dim);
        let k = &mut kv[..h.kv * h.dim];
        for head in q.chunks_exact_mut(h.dim) {
            rms_norm_in_place(head, q_norm, g.eps);
            rope.apply(head);
        }
        for head in k.chunks_exact_mut(h.dim) {
            rms_norm_in_place(head, k_norm, g.eps);
            rope.apply(head);
        }
        Ok(qkv)
    }

    /// The block's output into `out` from its input `x` and attention's
    /// output `attended`: the output projection, the post-attention norm and
    /// residual, the gated MLP between its norms, and the last residual
    /// (`norms`: post-attention, pre- and post-feedforward; `weights`: the
    /// output, gate/up and down projections' arrays).
    fn finish(
        &self,
        x: &[f32],
        attended: &[f32],
        norms: [&[f32]; 3],
        weights: [&[&[u8]]; 3],
        out: &mut [f32],
    ) -> Result<(), String> {
        let eps = self.geometry.eps;
        let [w_post_attn, w_pre_ffn, w_post_ffn] = norms;
        let [o_w, gate_up_w, down_w] = weights;
        let mut r = vec![0f32; self.hidden];
        self.projections[1].apply(o_w, attended, &mut r)?;
        let h: Vec<f32> = x
            .iter()
            .zip(rms_norm(&r, w_post_attn, eps))
            .map(|(a, b)| a + b)
            .collect();
        let normed = rms_norm(&h, w_pre_ffn, eps);
        let mut gate_up = vec![0f32; 2 * self.intermediate];
        self.projections[2].apply(gate_up_w, &normed, &mut gate_up)?;
        let (gate, up) = gate_up.split_at(self.intermediate);
        let mut gated = vec![0f32; self.intermediate];
        gated_gelu_into(gate, up, &mut gated);
        self.projections[3].apply(down_w, &gated, &mut r)?;
        for ((o, a), b) in out.iter_mut().zip(&h).zip(rms_norm(&r, w_post_ffn, eps)) {
            *o = a + b;
        }
        Ok(())
    }

    /// Each projection's share of `weights`, the arrays of the projections
    /// from `first` on, one after another.
    fn split_weights<'w, 'b>(
        &self,
        first: usize,
        weights: &'w [&'b [u8]],
    ) -> Result<Vec<&'w [&'b [u8]]>, String> {
        let mut rest = weights;
        let mut parts = Vec::with_capacity(self.projections.len());
        for p in self.projections.iter().skip(first) {
            if rest.len() < p.arrays() {
                return Err("the block operation lacks its projections' arrays".into());
            }
            let (part, more) = rest.split_at(p.arrays());
            parts.push(part);
            rest = more;
        }
        Ok(parts)
    }
}

/// The attention of one token's queries `q` (`[query · dim]`) over the
/// first `valid` positions of float32 `keys` and `values`
/// (`[kv, capacity, dim]`), as one output of `[query · dim]`.
fn attention(
    heads: Heads,
    scale: f32,
    q: &[f32],
    (keys, values): (&[f32], &[f32]),
    valid: i32,
) -> Result<Vec<f32>, String> {
    let row = heads.kv * heads.dim;
    let capacity = keys.len() / row.max(1);
    let valid = usize::try_from(valid).unwrap_or(0);
    if q.len() != heads.query * heads.dim
        || keys.len() != capacity * row
        || values.len() != keys.len()
        || valid == 0
        || valid > capacity
    {
        return Err(format!(
            "attention of {} query values over {} key and {} value values with {valid} \
             valid positions",
            q.len(),
            keys.len(),
            values.len()
        ));
    }
    let mut out = vec![0f32; heads.query * heads.dim];
    attend(q, keys, values, (capacity, valid), heads, scale, &mut out);
    Ok(out)
}

/// Float32 values of inputs, or an error naming the first that is not.
fn as_floats<'a, const N: usize>(
    bytes: [&'a [u8]; N],
    names: [&str; N],
) -> Result<[&'a [f32]; N], String> {
    let mut out: [&[f32]; N] = [&[]; N];
    for ((o, b), name) in out.iter_mut().zip(bytes).zip(names) {
        *o = floats(b).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(out)
}

/// The token `x` `[1, 1, H]` (float32) through block `layer` as one CPU
/// operation, which writes the token's key and value into the float32
/// buffers of `kv` in place (their arrays must be row-contiguous once
/// evaluated, as the caches' reserved buffers are). Returns the block's
/// output `[1, 1, H]`, or `None` when the block does not suit the operation
/// (a projection not on our CPU kernels, compressed or non-float32 stores);
/// the caller then runs the block in parts ([`CpuBlock`]) or as MLX
/// operations.
pub(crate) fn decode_layer_cpu(
    x: &Array,
    layer: &Layer,
    kv: &LayerKv<'_>,
    geometry: LayerGeometry,
) -> mlx_core::Result<Option<Array>> {
    let (KvStore::Float(keys), KvStore::Float(values)) = (kv.keys, kv.values) else {
        return Ok(None);
    };
    let (hkv, d) = (geometry.kv_heads, geometry.head_dim);
    let hidden = layer.input_norm.size();
    let store_shape = keys.shape();
    let fits = x.dtype() == Dtype::Float32
        && x.size() == hidden
        && store_shape.len() == 4
        && store_shape[0] == 1
        && store_shape[1] == hkv
        && store_shape[3] == d
        && values.shape() == store_shape
        && keys.dtype() == Dtype::Float32
        && values.dtype() == Dtype::Float32;
    if !fits {
        return Ok(None);
    }
    let mut read: Vec<&Array> = vec![x];
    read.extend(layer.norms());
    read.extend([kv.position, kv.write_at, kv.valid]);
    let leading = read.len();
    let Some(block) = Block::of(layer, geometry, &mut read)? else {
        return Ok(None);
    };
    let kernel: Arc<CpuKernelInPlaceFn> = Arc::new(move |read, written, out| {
        // One task on rayon's pool for the whole block, so that its
        // projections' parallel loops start from a worker (cheap) rather
        // than from MLX's stream thread.
        rayon::scope(|_| block.run_in_place(read, leading, written, out))
    });
    let shape = x.shape();
    cpu_kernel_in_place(&read, &[keys, values], &shape, Dtype::Float32, kernel).map(Some)
}

impl Block {
    /// The block on [`decode_layer_cpu`]'s inputs: `read` holds the token,
    /// the six norms, the position, slot and valid count (`leading` inputs),
    /// then the projections' arrays; `written` the key and value buffers.
    fn run_in_place(
        &self,
        read: &[&[u8]],
        leading: usize,
        written: &mut [&mut [u8]],
        out: &mut [u8],
    ) -> Result<(), String> {
        let h = self.heads();
        let (Some(first), Some(weights)) = (read.get(..leading), read.get(leading..)) else {
            return Err("the block operation lacks inputs".into());
        };
        let &[x, w_in, q_norm, k_norm, w_post_attn, w_pre_ffn, w_post_ffn, position, write_at, valid] =
            first
        else {
            return Err("the block operation lacks inputs".into());
        };
        let [x, w_in, q_norm, k_norm, w_post_attn, w_pre_ffn, w_post_ffn] = as_floats(
            [x, w_in, q_norm, k_norm, w_post_attn, w_pre_ffn, w_post_ffn],
            [
                "the token",
                "the input norm",
                "the q norm",
                "the k norm",
                "the post-attention norm",
                "the pre-feedforward norm",
                "the post-feedforward norm",
            ],
        )?;
        let (position, write_at, valid) = (scalar(position)?, scalar(write_at)?, scalar(valid)?);
        let [kw, vw] = written else {
            return Err("the block operation writes 2 buffers".into());
        };
        let keys = floats_mut(kw)?;
        let values = floats_mut(vw)?;
        let out = floats_mut(out)?;
        let cap = keys.len() / (h.kv * h.dim).max(1);
        let at = usize::try_from(write_at).unwrap_or(usize::MAX);
        if at >= cap || values.len() != keys.len() || out.len() != self.hidden {
            return Err(format!(
                "slot {write_at} of a buffer of {cap}, or buffers that do not match the block"
            ));
        }
        let &[qkv_w, o_w, gate_up_w, down_w] = self.split_weights(0, weights)?.as_slice() else {
            return Err("the block operation lacks its projections' arrays".into());
        };
        let qkv = self.queries_keys_values(x, [w_in, q_norm, k_norm], position, qkv_w)?;
        let (q, kv) = qkv.split_at(h.query * h.dim);
        let (k, v) = kv.split_at(h.kv * h.dim);
        for head in 0..h.kv {
            let slot = (head * cap + at) * h.dim;
            keys[slot..slot + h.dim].copy_from_slice(&k[head * h.dim..(head + 1) * h.dim]);
            values[slot..slot + h.dim].copy_from_slice(&v[head * h.dim..(head + 1) * h.dim]);
        }
        let attended = attention(h, self.geometry.scale, q, (keys, values), valid)?;
        let norms = [w_post_attn, w_pre_ffn, w_post_ffn];
        self.finish(x, &attended, norms, [o_w, gate_up_w, down_w], out)
    }
}

/// A block of one token as three CPU operations of ours, with the cache's
/// store and decoding (MLX's operations) between them: see the module's
/// documentation. The same arithmetic as [`decode_layer_cpu`].
pub(crate) struct CpuBlock<'a> {
    /// The block's weights.
    pub(crate) layer: &'a Layer,
    /// Its head layout and constants.
    pub(crate) geometry: LayerGeometry,
}

impl<'a> CpuBlock<'a> {
    /// The block of `layer`, or `None` where it does not suit our
    /// operations.
    pub(crate) fn of(layer: &'a Layer, geometry: LayerGeometry) -> mlx_core::Result<Option<Self>> {
        Ok(Block::of(layer, geometry, &mut Vec::new())?.map(|_| CpuBlock { layer, geometry }))
    }

    /// The queries, key and value of the token `x` (`[1, 1, H]`, float32)
    /// at RoPE position `position` (an int32 array `[1]`), one after another
    /// along the last axis of a `[1, 1, (Hq + 2·Hkv)·D]` array.
    pub(crate) fn queries_keys_values(
        &self,
        x: &Array,
        position: &Array,
    ) -> mlx_core::Result<Array> {
        let layer = self.layer;
        let mut read: Vec<&Array> =
            vec![x, &layer.input_norm, &layer.q_norm, &layer.k_norm, position];
        let leading = read.len();
        let Some(block) = Block::of(layer, self.geometry, &mut read)? else {
            return Err(unsuited());
        };
        // Only the Q/K/V projection's arrays are read here.
        read.truncate(leading + block.projections[0].arrays());
        let len = block.qkv_len() as i32;
        let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
            let (Some(&[x, w_in, q_norm, k_norm, position]), Some(weights)) =
                (inputs.get(..leading), inputs.get(leading..))
            else {
                return Err("the Q/K/V operation lacks inputs".into());
            };
            let [x, w_in, q_norm, k_norm] = as_floats(
                [x, w_in, q_norm, k_norm],
                ["the token", "the input norm", "the q norm", "the k norm"],
            )?;
            let norms = [w_in, q_norm, k_norm];
            let out = floats_mut(out)?;
            let qkv =
                rayon::scope(|_| block.queries_keys_values(x, norms, scalar(position)?, weights))?;
            out.copy_from_slice(&qkv);
            Ok(())
        });
        cpu_kernel(&read, &[1, 1, len], Dtype::Float32, kernel)
    }

    /// The attention of queries `q` (`[1, Hq, 1, D]` or `[1, 1, Hq·D]`,
    /// float32) over the first `valid` positions (an int32 array `[1]`) of
    /// float32 `keys` and `values` (`[1, Hkv, capacity, D]`), as
    /// `[1, 1, Hq·D]`.
    pub(crate) fn attention(
        &self,
        q: &Array,
        keys: &Array,
        values: &Array,
        valid: &Array,
    ) -> mlx_core::Result<Array> {
        let g = self.geometry;
        let heads = Heads {
            query: g.heads as usize,
            kv: g.kv_heads as usize,
            dim: g.head_dim as usize,
        };
        let float32 = [q, keys, values]
            .iter()
            .all(|a| a.dtype() == Dtype::Float32);
        let store = keys.shape();
        if !float32
            || store.len() != 4
            || store[0] != 1
            || store[1] != g.kv_heads
            || store[3] != g.head_dim
            || values.shape() != store
            || q.size() != heads.query * heads.dim
        {
            return Err(mlx_core::Error::Host(format!(
                "CPU attention of queries {:?} over keys {store:?} and values {:?}",
                q.shape(),
                values.shape()
            )));
        }
        let scale = g.scale;
        let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
            let [q, keys, values, valid] = inputs else {
                return Err(format!("attention takes 4 inputs, got {}", inputs.len()));
            };
            let [q, keys, values] =
                as_floats([q, keys, values], ["the queries", "the keys", "the values"])?;
            let kv = (keys, values);
            let out = floats_mut(out)?;
            let attended = rayon::scope(|_| attention(heads, scale, q, kv, scalar(valid)?))?;
            out.copy_from_slice(&attended);
            Ok(())
        });
        let len = (heads.query * heads.dim) as i32;
        cpu_kernel(
            &[q, keys, values, valid],
            &[1, 1, len],
            Dtype::Float32,
            kernel,
        )
    }

    /// The block's output `[1, 1, H]` from its input `x` and attention's
    /// output `attended` (`[1, 1, Hq·D]`, float32).
    pub(crate) fn finish(&self, x: &Array, attended: &Array) -> mlx_core::Result<Array> {
        let layer = self.layer;
        let mut read: Vec<&Array> = vec![
            x,
            attended,
            &layer.post_attention_norm,
            &layer.pre_feedforward_norm,
            &layer.post_feedforward_norm,
        ];
        let leading = read.len();
        let Some(block) = Block::of(layer, self.geometry, &mut read)? else {
            return Err(unsuited());
        };
        // The Q/K/V projection's arrays are not read here.
        let skipped = block.projections[0].arrays();
        read.drain(leading..leading + skipped);
        let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
            let (Some(&[x, attended, w_post_attn, w_pre_ffn, w_post_ffn]), Some(weights)) =
                (inputs.get(..leading), inputs.get(leading..))
            else {
                return Err("the block's last operation lacks inputs".into());
            };
            let [x, attended, w_post_attn, w_pre_ffn, w_post_ffn] = as_floats(
                [x, attended, w_post_attn, w_pre_ffn, w_post_ffn],
                [
                    "the token",
                    "attention's output",
                    "the post-attention norm",
                    "the pre-feedforward norm",
                    "the post-feedforward norm",
                ],
            )?;
            let norms = [w_post_attn, w_pre_ffn, w_post_ffn];
            let out = floats_mut(out)?;
            if x.len() != block.hidden || out.len() != block.hidden {
                return Err("the block's last operation: sizes do not match".into());
            }
            let &[o_w, gate_up_w, down_w] = block.split_weights(1, weights)?.as_slice() else {
                return Err("the block's last operation lacks its projections' arrays".into());
            };
            rayon::scope(|_| block.finish(x, attended, norms, [o_w, gate_up_w, down_w], out))
        });
        let shape = x.shape();
        cpu_kernel(&read, &shape, Dtype::Float32, kernel)
    }
}

/// The error of a block asked of our operations that does not suit them.
fn unsuited() -> mlx_core::Error {
    mlx_core::Error::Host("the block's projections are not all on our CPU kernels".into())
}

/// The one int32 value of an input's bytes.
fn scalar(bytes: &[u8]) -> Result<i32, String> {
    match bytemuck::try_cast_slice::<u8, i32>(bytes) {
        Ok([v]) => Ok(*v),
        _ => Err(format!("an int32 scalar input of {} bytes", bytes.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Gemma3Config;
    use crate::linear::Linear;
    use crate::load::{load, LoadOptions, ModelSource, WeightStorage};
    use crate::model::Gemma3;
    use crate::quant::Arithmetic;
    use mlx_core::block_dot::{affine_rows_dot_available, CpuKernels};
    use mlx_core::{quantize, zeros};

    /// A one-block random model with 4-bit affine weights on our kernel.
    fn affine_model() -> Gemma3 {
        let mut c = Gemma3Config::published("270m", Some(1)).unwrap();
        (c.vocab_size, c.hidden_size, c.intermediate_size) = (256, 64, 128);
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim) = (4, 2, 64);
        c.query_pre_attn_scalar = 64.0;
        let options = LoadOptions {
            dtype: Dtype::Float32,
            quantize: Some((4, 64)),
            weights: WeightStorage::Native(Arithmetic::int8(CpuKernels::best().unwrap())),
        };
        let source = ModelSource::Random {
            config: Box::new(c),
            seed: 5,
        };
        load(&source, options, &mut |_, _| {}).unwrap().model
    }

    #[test]
    fn the_block_writes_its_key_and_value_at_the_slot_in_place() {
        if !affine_rows_dot_available(CpuKernels::best().unwrap(), 4, 64).unwrap() {
            println!("SKIPPED: no affine kernel on this CPU");
            return;
        }
        let model = affine_model();
        let layer = &model.layers[0];
        let (keys, values) = (
            KvStore::Float(zeros(&[1, 2, 4, 64], Dtype::Float32).unwrap()),
            KvStore::Float(zeros(&[1, 2, 4, 64], Dtype::Float32).unwrap()),
        );
        for store in [&keys, &values] {
            store.arrays()[0].eval().unwrap();
        }
        let int = |v: i32| Array::from_slice(&[v], &[1]).unwrap();
        let (position, write_at, valid) = (int(2), int(1), int(2));
        let kv = LayerKv {
            keys: &keys,
            values: &values,
            position: &position,
            write_at: &write_at,
            valid: &valid,
        };
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37) % 17) as f32 / 8.0 - 1.0)
            .collect();
        let x = Array::from_slice(&x, &[1, 1, 64]).unwrap();
        let out = decode_layer_cpu(&x, layer, &kv, model.layer_geometry(0))
            .unwrap()
            .expect("the block is taken");
        assert!(out.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
        for store in [&keys, &values] {
            let v = store.arrays()[0].to_vec::<f32>().unwrap();
            for head in 0..2 {
                for slot in 0..4 {
                    let at = (head * 4 + slot) * 64;
                    let written = v[at..at + 64].iter().any(|&x| x != 0.0);
                    assert_eq!(written, slot == 1, "head {head}, slot {slot}");
                }
            }
        }
    }

    #[test]
    fn compressed_stores_and_dense_weights_are_left_to_mlx() {
        let model = affine_model();
        let int = |v: i32| Array::from_slice(&[v], &[1]).unwrap();
        let one = int(1);
        let x = zeros(&[1, 1, 64], Dtype::Float32).unwrap();
        let floats = KvStore::Float(zeros(&[1, 2, 4, 64], Dtype::Float32).unwrap());
        let packed = KvStore::Quantized(
            quantize(&zeros(&[1, 2, 4, 64], Dtype::Float32).unwrap(), 64, 8).unwrap(),
        );
        let kv = |keys| LayerKv {
            keys,
            values: &floats,
            position: &one,
            write_at: &one,
            valid: &one,
        };
        let g = model.layer_geometry(0);
        assert!(decode_layer_cpu(&x, &model.layers[0], &kv(&packed), g)
            .unwrap()
            .is_none());
        let mut dense = model.layers[0].clone();
        dense.o_proj = Linear::Dense(zeros(&[64, 256], Dtype::Float32).unwrap());
        assert!(!runs(&dense).unwrap());
        assert!(decode_layer_cpu(&x, &dense, &kv(&floats), g)
            .unwrap()
            .is_none());
    }
}
