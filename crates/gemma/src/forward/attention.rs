//! Attention of queries over what a cache returned, on the default device.

use mlx_core::fast::{scaled_dot_product_attention, AttentionMask};
use mlx_core::{Array, Dtype};

use super::placement::Placement;
use super::query_rounding::rounded_queries;
use crate::cache::turbo::{rotate, unrotate};
use crate::cache::{Attend, CacheError, KeyMask, KvStore, QueryRounding, Rotation};
use crate::cpu::prompt_attention::{self as cpu_prompt_attention, RowMask};
use crate::cuda::decode_attention_stored;
use crate::model::ModelError;

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

/// Attention of queries `[B, Hq, L, D]` over what a cache returned: where
/// the cache rotated its keys ([`crate::cache::Rotation`]) the queries are
/// rotated alike, and where it rotated its values the output is rotated
/// back.
pub(super) fn attend_to(
    q: &Array,
    attend: &Attend,
    scale: f32,
    place: Placement,
) -> Result<Array, ModelError> {
    let rotation = attend.rotation;
    let out = attend_stored(&rotation.keys_side(q)?, attend, scale, place)?;
    Ok(rotation.values_side(&out)?)
}

/// Attention of queries `[B, Hq, L, D]` (rotated as the keys were) over
/// what a cache stored.
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
fn attend_stored(
    q: &Array,
    attend: &Attend,
    scale: f32,
    place: Placement,
) -> Result<Array, ModelError> {
    let rounded = rounded_queries(q, attend)?;
    let q = &rounded;
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
            queries: QueryRounding::Exact,
            rotation: Rotation::NONE,
        };
        return finish(attend_stored(&queries, &decoded, scale, place)?);
    }
    let (keys, values) = (
        attend.keys.decoded(q.dtype())?,
        attend.values.decoded(q.dtype())?,
    );
    if !place.gpu && q.dim(2)? > 1 {
        // A float16 or bfloat16 cache under float32 queries: its vectors
        // widened (exactly) to float32 for our masked softmax, as MLX's
        // attention would promote them, with its scalar `exp`.
        let widened = |a: &Array| -> mlx_core::Result<Array> {
            match (q.dtype(), a.dtype()) {
                (Dtype::Float32, Dtype::Float16 | Dtype::Bfloat16) => a.astype(Dtype::Float32),
                _ => Ok(a.clone()),
            }
        };
        let (keys, values) = (widened(&keys)?, widened(&values)?);
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
pub(super) fn decode_turbo(store: &KvStore, dtype: Dtype) -> Result<KvStore, CacheError> {
    Ok(match store {
        KvStore::Turbo(t) => KvStore::Float(t.decode_rotated(dtype)?),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::KvFormat;

    #[test]
    fn a_float16_cache_under_float32_queries_attends_as_its_widened_vectors_do() {
        // A prompt chunk of 6 queries (4 heads) over 9 keys and values of one
        // head held in float16: the CPU's own masked attention of their exact
        // float32 widening, as MLX's attention of the widened vectors gives it.
        let wave =
            |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * f).sin() * 2.0).collect() };
        let d = 64;
        let q = Array::from_slice(&wave(4 * 6 * d, 0.37), &[1, 4, 6, d as i32]).unwrap();
        let kv = |f: f32| {
            Array::from_slice(&wave(9 * d, f), &[1, 1, 9, d as i32])
                .unwrap()
                .astype(Dtype::Float16)
                .unwrap()
        };
        let (keys, values) = (kv(0.53), kv(0.71));
        let f16 = KvFormat::Float(Some(Dtype::Float16));
        let attend = Attend {
            keys: KvStore::encode(&keys, f16).unwrap(),
            values: KvStore::encode(&values, f16).unwrap(),
            mask: KeyMask::Causal,
            queries: QueryRounding::Exact,
            rotation: Rotation::NONE,
        };
        let scale = 0.125;
        let ours = cache_attention(&q, &attend, scale, false).unwrap();
        assert_eq!(ours.dtype(), Dtype::Float32);
        let widened = |a: &Array| a.astype(Dtype::Float32).unwrap();
        let theirs = scaled_dot_product_attention(
            &q,
            &widened(&keys),
            &widened(&values),
            scale,
            AttentionMask::Causal,
        )
        .unwrap();
        let (ours, theirs) = (
            ours.to_vec::<f32>().unwrap(),
            theirs.to_vec::<f32>().unwrap(),
        );
        assert_eq!(ours.len(), theirs.len());
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "value {i}: {a} against {b}"
            );
        }
    }
}
