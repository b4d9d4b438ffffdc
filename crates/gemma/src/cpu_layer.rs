//! A whole decoder block for one token as one CPU operation.
//!
//! MLX's CPU backend spends host time on every operation (building the
//! graph, handing each operation to its stream thread), and a block decoded
//! as MLX operations is about 35 of them: with the projections already on
//! our kernels, that overhead was more than half of a token of the default
//! model (docs/performance.md). This operation runs what the eager pass
//! runs — the input norm, Q/K/V, the q/k norms and RoPE, the cache write,
//! attention, the output projection, the residual norms and the gated MLP —
//! as one kernel on rayon's pool, its projections on our block kernels
//! ([`crate::weights::gguf::rows_times`], [`crate::affine_linear`]), and
//! writes the token's key and value into the step's float32 buffers in
//! place. It computes in float32 as the eager pass does on the CPU; only the
//! order of additions differs.

use std::sync::Arc;

use mlx_core::cpu_kernel::{cpu_kernel_in_place, CpuKernelInPlaceFn};
use mlx_core::{Array, Dtype};

use crate::cache::KvStore;
use crate::cpu_attention::{attend, dot, Heads};
use crate::cpu_gelu::gated_gelu_into;
use crate::cpu_projection::{floats, Projection};
use crate::kernels::{LayerGeometry, LayerKv};
use crate::model::Layer;

/// Inputs before the projections' arrays: the token's hidden state, the six
/// norms' weights and the three positions.
const LEADING_INPUTS: usize = 10;

/// Whether every projection of `layer` is on our CPU kernels, so that
/// [`decode_layer_cpu`] takes the block (given float32 stores).
pub(crate) fn runs(layer: &Layer) -> mlx_core::Result<bool> {
    Ok(projections(layer, &mut Vec::new())?.is_some())
}

/// The block's Q/K/V, output, gate/up and down projections, pushing the
/// arrays they read onto `arrays`; `None` where one is not on our CPU
/// kernels.
fn projections<'a>(
    layer: &'a Layer,
    arrays: &mut Vec<&'a Array>,
) -> mlx_core::Result<Option<[Projection; 4]>> {
    let mut out = Vec::with_capacity(4);
    for linear in [
        &layer.qkv_proj,
        &layer.o_proj,
        &layer.gate_up_proj,
        &layer.down_proj,
    ] {
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
    capacity: usize,
    /// Q/K/V, output, gate/up and down.
    projections: [Projection; 4],
}

/// The token `x` `[1, 1, H]` (float32) through block `layer` as one CPU
/// operation, which writes the token's key and value into the float32
/// buffers of `kv` in place (their arrays must be row-contiguous once
/// evaluated, as the caches' reserved buffers are). Returns the block's
/// output `[1, 1, H]`, or `None` when the block does not suit the operation
/// (a projection not on our CPU kernels, compressed or non-float32 stores);
/// the caller then runs the block as MLX operations.
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
    let norms = [
        &layer.input_norm,
        &layer.q_norm,
        &layer.k_norm,
        &layer.post_attention_norm,
        &layer.pre_feedforward_norm,
        &layer.post_feedforward_norm,
    ];
    if norms.iter().any(|n| n.dtype() != Dtype::Float32) {
        return Ok(None);
    }
    let mut read: Vec<&Array> = vec![x];
    read.extend(norms);
    read.extend([kv.position, kv.write_at, kv.valid]);
    let Some(projections) = projections(layer, &mut read)? else {
        return Ok(None);
    };
    let (hq, d_us) = (geometry.heads as usize, d as usize);
    let intermediate = projections[2].rows() / 2;
    let rows_fit = projections[0].rows() == (hq + 2 * hkv as usize) * d_us
        && projections[1].rows() == hidden
        && projections[2].rows() == 2 * intermediate
        && projections[3].rows() == hidden;
    if !rows_fit {
        return Ok(None);
    }
    let block = Block {
        geometry,
        hidden,
        intermediate,
        capacity: store_shape[2] as usize,
        projections,
    };
    let kernel: Arc<CpuKernelInPlaceFn> = Arc::new(move |read, written, out| {
        // One task on rayon's pool for the whole block, so that its
        // projections' parallel loops start from a worker (cheap) rather
        // than from MLX's stream thread.
        rayon::scope(|_| block.run(read, written, out))
    });
    let shape = x.shape();
    cpu_kernel_in_place(&read, &[keys, values], &shape, Dtype::Float32, kernel).map(Some)
}

impl Block {
    /// The block on the operation's inputs (see [`decode_layer_cpu`]).
    fn run(&self, read: &[&[u8]], written: &mut [&mut [u8]], out: &mut [u8]) -> Result<(), String> {
        let g = &self.geometry;
        let (hq, hkv, d) = (g.heads as usize, g.kv_heads as usize, g.head_dim as usize);
        let (Some(leading), Some(weights)) =
            (read.get(..LEADING_INPUTS), read.get(LEADING_INPUTS..))
        else {
            return Err("the block operation lacks inputs".into());
        };
        let [x, w_in, q_norm, k_norm, w_post_attn, w_pre_ffn, w_post_ffn] =
            [0, 1, 2, 3, 4, 5, 6].map(|i| floats(leading[i]));
        let [x, w_in, q_norm, k_norm, w_post_attn, w_pre_ffn, w_post_ffn] = [
            x?,
            w_in?,
            q_norm?,
            k_norm?,
            w_post_attn?,
            w_pre_ffn?,
            w_post_ffn?,
        ];
        let [position, write_at, valid] = [7, 8, 9].map(|i| scalar(leading[i]));
        let (position, write_at, valid) = (position?, write_at?, valid?);
        let cap = self.capacity;
        let (Ok(at), Ok(valid)) = (usize::try_from(write_at), usize::try_from(valid)) else {
            return Err(format!(
                "slot {write_at} or valid count {valid} is negative"
            ));
        };
        if at >= cap || valid == 0 || valid > cap {
            return Err(format!(
                "slot {at} and {valid} valid positions in a buffer of {cap}"
            ));
        }
        let [kw, vw] = written else {
            return Err("the block operation writes 2 buffers".into());
        };
        let keys: &mut [f32] = bytemuck::try_cast_slice_mut(kw).map_err(|e| e.to_string())?;
        let values: &mut [f32] = bytemuck::try_cast_slice_mut(vw).map_err(|e| e.to_string())?;
        let out: &mut [f32] = bytemuck::try_cast_slice_mut(out).map_err(|e| e.to_string())?;
        if keys.len() != hkv * cap * d || values.len() != keys.len() || out.len() != self.hidden {
            return Err("the block operation's buffers do not match its shapes".into());
        }
        let mut weights = weights;
        let mut next = |p: &Projection| {
            let (mine, rest) = weights.split_at(p.arrays().min(weights.len()));
            weights = rest;
            mine
        };
        let [qkv_w, o_w, gate_up_w, down_w] = [
            next(&self.projections[0]),
            next(&self.projections[1]),
            next(&self.projections[2]),
            next(&self.projections[3]),
        ];

        // Attention.
        let normed = rms_norm(x, w_in, g.eps);
        let mut qkv = vec![0f32; (hq + 2 * hkv) * d];
        self.projections[0].apply(qkv_w, &normed, &mut qkv)?;
        let (q, kv) = qkv.split_at_mut(hq * d);
        let (k, v) = kv.split_at_mut(hkv * d);
        let rope = RopeTable::new(position as f32 * g.rope_scale, g.rope_base, d);
        for head in q.chunks_exact_mut(d) {
            rms_norm_in_place(head, q_norm, g.eps);
            rope.apply(head);
        }
        for head in k.chunks_exact_mut(d) {
            rms_norm_in_place(head, k_norm, g.eps);
            rope.apply(head);
        }
        for h in 0..hkv {
            let slot = (h * cap + at) * d;
            keys[slot..slot + d].copy_from_slice(&k[h * d..(h + 1) * d]);
            values[slot..slot + d].copy_from_slice(&v[h * d..(h + 1) * d]);
        }
        let mut attended = vec![0f32; hq * d];
        let heads = Heads {
            query: hq,
            kv: hkv,
            dim: d,
        };
        attend(q, keys, values, (cap, valid), heads, g.scale, &mut attended);
        let mut r = vec![0f32; self.hidden];
        self.projections[1].apply(o_w, &attended, &mut r)?;
        let h: Vec<f32> = x
            .iter()
            .zip(rms_norm(&r, w_post_attn, g.eps))
            .map(|(a, b)| a + b)
            .collect();

        // The gated MLP.
        let normed = rms_norm(&h, w_pre_ffn, g.eps);
        let mut gate_up = vec![0f32; 2 * self.intermediate];
        self.projections[2].apply(gate_up_w, &normed, &mut gate_up)?;
        let (gate, up) = gate_up.split_at(self.intermediate);
        let mut gated = vec![0f32; self.intermediate];
        gated_gelu_into(gate, up, &mut gated);
        self.projections[3].apply(down_w, &gated, &mut r)?;
        for ((o, a), b) in out.iter_mut().zip(&h).zip(rms_norm(&r, w_post_ffn, g.eps)) {
            *o = a + b;
        }
        Ok(())
    }
}

/// The one int32 value of an input's bytes.
fn scalar(bytes: &[u8]) -> Result<i32, String> {
    match bytemuck::try_cast_slice::<u8, i32>(bytes) {
        Ok([v]) => Ok(*v),
        _ => Err(format!("an int32 scalar input of {} bytes", bytes.len())),
    }
}

/// `w · x / √(mean(x²) + eps)`.
fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    rms_norm_in_place(&mut out, w, eps);
    out
}

/// [`rms_norm`] in place.
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let inverse = 1.0 / (dot(x, x) / x.len().max(1) as f32 + eps).sqrt();
    for (v, w) in x.iter_mut().zip(w) {
        *v = w * (*v * inverse);
    }
}

/// RoPE's cosines and sines at one position, for vectors whose halves
/// rotate together (MLX's non-traditional layout).
struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// The table of `position` (already scaled) for `dim`-wide vectors.
    fn new(position: f32, base: f32, dim: usize) -> RopeTable {
        let half = dim / 2;
        let (cos, sin) = (0..half)
            .map(|i| {
                let frequency = (-(i as f32) / half as f32 * base.log2()).exp2();
                let theta = position * frequency;
                (theta.cos(), theta.sin())
            })
            .unzip();
        RopeTable { cos, sin }
    }

    /// Rotates `x` in place.
    fn apply(&self, x: &mut [f32]) {
        let (a, b) = x.split_at_mut(self.cos.len());
        for (((a, b), c), s) in a.iter_mut().zip(b).zip(&self.cos).zip(&self.sin) {
            let (x1, x2) = (*a, *b);
            *a = x1 * c - x2 * s;
            *b = x1 * s + x2 * c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Gemma3Config;
    use crate::linear::Linear;
    use crate::load::{load, LoadOptions, ModelSource, WeightStorage};
    use crate::model::Gemma3;
    use crate::weights::gguf::Activations;
    use mlx_core::block_dot::affine_rows_dot_available;
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
            weights: WeightStorage::Native(Activations::Int8),
        };
        let source = ModelSource::Random {
            config: Box::new(c),
            seed: 5,
        };
        load(&source, options, &mut |_, _| {}).unwrap().model
    }

    #[test]
    fn the_block_writes_its_key_and_value_at_the_slot_in_place() {
        if !affine_rows_dot_available(4, 64).unwrap() {
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
