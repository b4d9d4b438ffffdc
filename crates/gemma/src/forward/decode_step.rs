//! A single-token decode step of fixed shapes, traced once and compiled by
//! MLX, for the generation loop.
//!
//! The eager forward pass builds its graph anew through the FFI for every
//! token, with key lengths that grow by one per step. Here the caches are
//! reserved up front ([`LayerCache::reserve_fixed`]: buffers of their final
//! capacity in the cache's format, float or compressed), each new key and
//! value is encoded in that format and written at a position held in an
//! array, and attention runs over the whole buffers masked to their valid
//! positions (on the GPU through [`crate::cuda::decode_attention_stored`],
//! which reads only those, decoding compressed rows in registers; with
//! [`Gemma3::gpu_kernels`], each whole block runs as one
//! [`crate::cuda::decode_layer`] kernel, which encodes the new key and
//! value and writes them into the buffers in place). Shapes never change, so MLX traces the step once;
//! every later step replays the traced graph (its elementwise chains fused)
//! without building it again.

use mlx_core::{arange, where_, Array, Dtype, Function};

use super::kv_target::{FixedTarget, KvTarget};
use crate::cache::{CacheError, FixedSlot, KvStore, LayerCache, VectorSpec};
use crate::model::{Gemma3, ModelError};

/// Inputs before the per-layer buffers: the token and the slots.
const LEADING_INPUTS: usize = 2;

/// Entries of the slots input: the global layers' position, write slot and
/// valid count, then the sliding layers'. They travel as one array because
/// MLX's CUDA allocator keeps arrays of 8 bytes or less in a managed pool
/// advised read-mostly, and reading scalars there cost the fused layer
/// kernel 5–9 µs at its start and 2–9 µs more at its RoPE on the H200
/// (about 1 µs for a 16-byte array); the slices of one 24-byte array are read
/// where it lies. That made the fused step 1.08–1.20× faster
/// (docs/performance.md).
const SLOTS: usize = 6;

/// Where one kind of cache (global or sliding) takes the next token: its
/// RoPE position, the buffer slot it goes to, and the valid positions after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KindSlot {
    position: i32,
    write_at: i32,
    valid: i32,
}

/// A compiled fixed-shape decode step of one model.
pub struct DecodeStep {
    function: Function,
    spec: VectorSpec,
    sliding: Vec<bool>,
}

impl DecodeStep {
    /// The step of `model`; `compiled` false runs the same graph eagerly
    /// (for comparison).
    pub fn new(model: &Gemma3, compiled: bool) -> Result<DecodeStep, ModelError> {
        let traced = model.clone();
        let function = Function::new(move |inputs: &[Array]| fixed_forward(&traced, inputs))?;
        let function = if compiled {
            function.compile(false)?
        } else {
            function
        };
        let c = &model.config;
        Ok(DecodeStep {
            function,
            spec: VectorSpec {
                heads: c.num_key_value_heads as i32,
                dim: c.head_dim as i32,
                dtype: model.dtype,
            },
            sliding: (0..c.num_hidden_layers).map(|i| c.is_sliding(i)).collect(),
        })
    }

    /// Readies `caches` (from [`Gemma3::make_caches`]) for steps until they
    /// hold `positions` tokens. Returns false when some cache cannot take
    /// fixed-shape steps (its format changes before then, or it holds a
    /// batch of several); the eager forward pass then serves.
    pub fn reserve(&self, caches: &mut [LayerCache], positions: i32) -> Result<bool, ModelError> {
        for cache in caches.iter_mut() {
            if !cache.reserve_fixed(positions, self.spec)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Logits `[1, 1, vocab]` of `token` (`[1, 1]` integer ids) fed after
    /// what the reserved `caches` hold; the caches take the token.
    pub fn forward(&self, token: &Array, caches: &mut [LayerCache]) -> Result<Array, ModelError> {
        if caches.len() != self.sliding.len() {
            return Err(ModelError::Input(format!(
                "{} caches given for {} layers",
                caches.len(),
                self.sliding.len()
            )));
        }
        // Every cache of a kind must take the token at the same slot; the
        // kinds may differ (a benchmark that trims the global caches back
        // while the wrapped sliding ones cannot be), each RoPE'd at its own
        // position as in the eager pass.
        let (mut global, mut ring): (Option<KindSlot>, Option<KindSlot>) = (None, None);
        let mut slots: Vec<FixedSlot> = Vec::with_capacity(caches.len());
        for (i, (cache, &sliding)) in caches.iter().zip(&self.sliding).enumerate() {
            let slot = cache.fixed_slot().ok_or_else(|| {
                ModelError::Input(format!(
                    "the cache of layer {i} is not reserved for fixed-shape steps, or is full"
                ))
            })?;
            let here = KindSlot {
                position: cache.offset(),
                write_at: slot.write_at,
                valid: slot.valid,
            };
            let kind = match (cache, sliding) {
                (LayerCache::Plain(_), false) => &mut global,
                (LayerCache::Rotating(_), true) => &mut ring,
                _ => {
                    return Err(ModelError::Input(format!(
                        "the cache of layer {i} is of the wrong kind for its layer"
                    )))
                }
            };
            if *kind.get_or_insert(here) != here {
                return Err(ModelError::Input(format!(
                    "the cache of layer {i} is not in step with the other caches of its kind"
                )));
            }
            slots.push(slot);
        }
        let unused = KindSlot {
            position: 0,
            write_at: 0,
            valid: 1,
        };
        let (global, ring) = (global.unwrap_or(unused), ring.unwrap_or(unused));
        let slot_values = Array::from_slice(
            &[
                global.position,
                global.write_at,
                global.valid,
                ring.position,
                ring.write_at,
                ring.valid,
            ],
            &[SLOTS as i32],
        )?;
        // One token dtype, so that MLX traces the step once.
        let token = token.astype(Dtype::Uint32)?;
        let mut inputs: Vec<&Array> = vec![&token, &slot_values];
        for slot in &slots {
            inputs.extend(slot.keys.arrays());
            inputs.extend(slot.values.arrays());
        }
        // The caches drop their old buffers as they take the new ones, so by
        // evaluation only the step's graph holds them and MLX writes in place.
        let outputs = self.function.call(&inputs)?;
        let (logits, mut buffers) = outputs
            .split_first()
            .ok_or_else(|| ModelError::Input("the decode step returned nothing".into()))?;
        for cache in caches.iter_mut() {
            let (keys, taken) = KvStore::from_arrays(buffers, self.spec.dim)?;
            let (values, rest) = KvStore::from_arrays(&buffers[taken..], self.spec.dim)?;
            buffers = &buffers[taken + rest..];
            cache.commit_fixed(keys, values);
        }
        Ok(logits.clone())
    }
}

/// The traced step: inputs `[token, slots, k₀, v₀, k₁, v₁, …]` (the slots
/// as [`SLOTS`] says, each buffer the arrays of its store, see
/// [`KvStore::from_arrays`]), outputs `[logits, k₀', v₀', …]` alike.
fn fixed_forward(model: &Gemma3, inputs: &[Array]) -> mlx_core::Result<Vec<Array>> {
    let host = |e: ModelError| match e {
        ModelError::Mlx(e) | ModelError::Cache(CacheError::Mlx(e)) => e,
        other => mlx_core::Error::Host(other.to_string()),
    };
    let (Some([token, slots]), buffers) = (
        inputs
            .get(..LEADING_INPUTS)
            .and_then(|s| <&[Array; LEADING_INPUTS]>::try_from(s).ok()),
        inputs.get(LEADING_INPUTS..).unwrap_or(&[]),
    ) else {
        return Err(mlx_core::Error::Host(format!(
            "the decode step takes at least {LEADING_INPUTS} inputs, got {}",
            inputs.len()
        )));
    };
    let slot = |i: i32| slots.slice(&[i], &[i + 1], &[1]);
    let [position, write_at, global_valid, ring_position, ring_at, ring_valid] =
        [slot(0)?, slot(1)?, slot(2)?, slot(3)?, slot(4)?, slot(5)?];
    let layers = model.layers.len();
    let dim = model.config.head_dim as i32;
    let mut stores = Vec::with_capacity(2 * layers);
    let mut rest = buffers;
    while !rest.is_empty() {
        let (store, taken) = KvStore::from_arrays(rest, dim).map_err(|e| host(e.into()))?;
        stores.push(store);
        rest = &rest[taken..];
    }
    if stores.len() != 2 * layers {
        return Err(mlx_core::Error::Host(format!(
            "the decode step takes 2 buffers per layer ({layers} layers), got {}",
            stores.len()
        )));
    }
    let valid_of = |sliding: bool| {
        if sliding {
            &ring_valid
        } else {
            &global_valid
        }
    };
    let mut masks: Vec<(bool, i32, Array)> = Vec::new();
    let mut mask_of = |sliding: bool, capacity: i32| -> mlx_core::Result<usize> {
        if let Some(i) = masks
            .iter()
            .position(|(s, c, _)| *s == sliding && *c == capacity)
        {
            return Ok(i);
        }
        let mask = valid_mask(capacity, valid_of(sliding), model.dtype)?;
        masks.push((sliding, capacity, mask));
        Ok(masks.len() - 1)
    };
    let mut chosen = Vec::with_capacity(layers);
    for (i, pair) in stores.chunks(2).enumerate() {
        let sliding = model.config.is_sliding(i);
        chosen.push((sliding, mask_of(sliding, pair[0].positions())?));
    }
    let mut targets: Vec<KvTarget<'_>> = stores
        .chunks(2)
        .zip(&chosen)
        .map(|(pair, &(sliding, mask))| {
            KvTarget::Fixed(FixedTarget {
                keys: pair[0].clone(),
                values: pair[1].clone(),
                position: if sliding { &ring_position } else { &position },
                write_at: if sliding { &ring_at } else { &write_at },
                valid: valid_of(sliding),
                mask: &masks[mask].2,
            })
        })
        .collect();
    let hidden = model.hidden_with(token, &mut targets).map_err(host)?;
    let mut out = vec![model.logits(&hidden).map_err(host)?];
    for target in targets {
        if let KvTarget::Fixed(f) = target {
            out.extend(f.keys.arrays().into_iter().cloned());
            out.extend(f.values.arrays().into_iter().cloned());
        }
    }
    Ok(out)
}

/// Additive mask `[1, capacity]`: 0 on the first `valid` positions (an int32
/// array `[1]`), −∞ after.
fn valid_mask(capacity: i32, valid: &Array, dtype: Dtype) -> mlx_core::Result<Array> {
    let seen = arange(0.0, capacity as f64, 1.0, Dtype::Int32)?.less(valid)?;
    where_(
        &seen,
        &Array::scalar(0.0, dtype)?,
        &Array::scalar(f64::NEG_INFINITY, dtype)?,
    )?
    .reshape(&[1, capacity])
}
