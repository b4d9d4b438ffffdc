//! What the two kinds of cache share: the formats of a cache's keys and
//! values, what attention reads after an update, the fixed-shape slots of
//! the compiled step, and the bookkeeping of a pair of key and value
//! buffers.

use mlx_core::Array;

use super::error::CacheError;
use super::format::{KvFormat, KvStore, VectorSpec};
use super::rotation::Rotation;

/// Positions are allocated in multiples of this many.
pub const STEP: i32 = 256;

/// The formats of one cache's keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheFormat {
    /// How keys are stored.
    pub keys: KvFormat,
    /// How values are stored.
    pub values: KvFormat,
    /// Which sides are rotated before they are stored ([`Rotation`]).
    pub rotation: Rotation,
}

impl CacheFormat {
    /// Keys and values unquantized in the compute dtype.
    pub const COMPUTE: CacheFormat = CacheFormat {
        keys: KvFormat::Float(None),
        values: KvFormat::Float(None),
        rotation: Rotation::NONE,
    };

    /// The format in effect after `offset` tokens when the cache keeps the
    /// compute dtype until `start` tokens (mlx-lm's `quantized_kv_start`);
    /// the rotation holds from the first token, so that the floats kept
    /// before `start` are converted as they are.
    pub fn active(&self, offset: i32, start: i32) -> CacheFormat {
        if offset < start {
            CacheFormat {
                rotation: self.rotation,
                ..CacheFormat::COMPUTE
            }
        } else {
            *self
        }
    }

    /// New keys and values `[B, heads, n, dim]` as stored: rotated where
    /// the format says, then encoded.
    pub(crate) fn encode(
        &self,
        keys: &Array,
        values: &Array,
    ) -> Result<(KvStore, KvStore), CacheError> {
        Ok((
            KvStore::encode(&self.rotation.keys_side(keys)?, self.keys)?,
            KvStore::encode(&self.rotation.values_side(values)?, self.values)?,
        ))
    }

    /// Checks that keys and values of `dim` values can be stored so.
    pub fn validate(&self, dim: i32) -> Result<(), CacheError> {
        self.keys.validate(dim)?;
        self.values.validate(dim)?;
        self.rotation.validate(dim)
    }
}

/// Re-encodes `keys` and `values` in `format` where they are still floats.
pub(crate) fn convert_stores(
    keys: &mut Option<KvStore>,
    values: &mut Option<KvStore>,
    format: CacheFormat,
) -> Result<(), CacheError> {
    if let Some(k) = keys.as_mut() {
        *k = k.convert(format.keys)?;
    }
    if let Some(v) = values.as_mut() {
        *v = v.convert(format.values)?;
    }
    Ok(())
}

/// Which keys each query may see, beyond what the returned keys already limit.
#[derive(Debug, Clone)]
pub enum KeyMask {
    /// Every returned key.
    All,
    /// Query i sees keys up to i + (keys − queries).
    Causal,
    /// A boolean `[queries, keys]` array: true where the query sees the key.
    Array(Array),
    /// The leading `valid` keys (an int32 array `[1]`), for one query; the
    /// same mask as an additive `[1, keys]` array (0 seen, −∞ not).
    Leading {
        /// How many leading keys the query sees.
        valid: Array,
        /// 0 on those keys, −∞ on the rest.
        additive: Array,
    },
}

/// A cache's buffers laid out for a fixed-shape single-token step
/// (the compiled decode step): keys and values of
/// `[1, heads, capacity, …]` in the cache's format, the position the next
/// token is written at, and how many leading positions hold valid vectors
/// once it is written.
#[derive(Debug, Clone)]
pub struct FixedSlot {
    /// The key buffer.
    pub keys: KvStore,
    /// The value buffer.
    pub values: KvStore,
    /// Where the next token's key and value go.
    pub write_at: i32,
    /// Leading positions valid after the write (the rest is masked).
    pub valid: i32,
}

/// Where a block's key and value go in a fixed-shape step and what its
/// attention reads (the CPU's and the GPU's decode blocks take it): stores of
/// `[1, Hkv, capacity, D]` in any cache format, written in place at
/// `write_at` (the new key and value encoded as the eager path encodes
/// them), attended to on their first `valid` positions; the token's RoPE
/// position. The three positions are int32 arrays `[1]`. The stores' arrays
/// must be row-contiguous once evaluated (as the caches' reserved buffers
/// are): MLX would hand the kernel a contiguous copy of any other, and the
/// write would be lost.
#[derive(Debug, Clone, Copy)]
pub struct LayerKv<'a> {
    /// Key store (written in place).
    pub keys: &'a KvStore,
    /// Value store (written in place).
    pub values: &'a KvStore,
    /// RoPE position of the token.
    pub position: &'a Array,
    /// Buffer slot of the token.
    pub write_at: &'a Array,
    /// Valid leading positions after the write.
    pub valid: &'a Array,
}

/// How attention treats the queries before their products with a cache's
/// keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueryRounding {
    /// As computed, in the compute dtype.
    #[default]
    Exact,
    /// As llama.cpp's CPU flash attention treats a prompt batch's queries
    /// (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`): unless keys and
    /// values are both f16 or f32 (its tiled f32 path), each query
    /// is converted to the keys' dot-product type first — rounded to f16
    /// against float keys (llama.cpp casts f32 keys to f16), to bf16
    /// against bf16 keys, quantized to 8-bit blocks of 32 against ggml
    /// block keys; TurboQuant and MLX affine keys take it as it is. Its
    /// accumulation of f16 values in f16 is not reproduced.
    LlamaCpu,
}

/// What attention reads after a cache update: the keys and values to attend
/// to, the mask over them, and how the queries are treated.
#[derive(Debug, Clone)]
pub struct Attend {
    /// Keys, `[B, heads, keys, dim]` in the cache's format.
    pub keys: KvStore,
    /// Values, `[B, heads, keys, dim]` in the cache's format.
    pub values: KvStore,
    /// The mask.
    pub mask: KeyMask,
    /// How the queries are treated.
    pub queries: QueryRounding,
    /// Which sides were rotated before they were stored: the queries are
    /// rotated alike, the output back.
    pub rotation: Rotation,
}

/// `n` rounded up to a multiple of [`STEP`].
pub(crate) fn round_up(n: i32) -> i32 {
    (n + STEP - 1) / STEP * STEP
}

/// The arrays held by a cache's key and value buffers.
pub(crate) fn pair_arrays<'a>(
    keys: &'a Option<KvStore>,
    values: &'a Option<KvStore>,
) -> Vec<&'a Array> {
    keys.iter()
        .chain(values.iter())
        .flat_map(KvStore::arrays)
        .collect()
}

/// Readies a cache's buffers for fixed-shape steps (see
/// [`crate::cache::LayerCache::reserve_fixed`]): false, changing nothing, unless the
/// format in effect `now` is still in effect at the `last` position to come
/// and the buffers (if any) are of batch 1. Otherwise the buffers are
/// converted to that format and grown (or created) to at least `capacity`
/// positions, zero-filled past what they held.
pub(crate) fn reserve_fixed_pair(
    keys: &mut Option<KvStore>,
    values: &mut Option<KvStore>,
    (now, last): (CacheFormat, CacheFormat),
    capacity: i32,
    spec: VectorSpec,
) -> Result<bool, CacheError> {
    if now != last || !fixed_ready(keys, values, now) {
        return Ok(false);
    }
    convert_stores(keys, values, now)?;
    for (store, stored) in [(keys, now.keys), (values, now.values)] {
        let grown = match store.take() {
            None => stored.zeros(spec, capacity)?,
            Some(s) if s.positions() < capacity => {
                let extra = KvStore::zeros_like(&s, capacity - s.positions())?;
                KvStore::concat(&[&s, &extra])?
            }
            Some(s) => s,
        };
        *store = Some(grown);
    }
    Ok(true)
}

/// The fixed-shape slot of a cache whose buffers hold `format` (see
/// [`crate::cache::LayerCache::fixed_slot`]): `None` unless both are of batch 1 with room
/// at `write_at`.
pub(crate) fn fixed_slot_of(
    keys: &Option<KvStore>,
    values: &Option<KvStore>,
    format: CacheFormat,
    write_at: i32,
    valid: i32,
) -> Option<FixedSlot> {
    if !fixed_ready(keys, values, format) {
        return None;
    }
    let room = |s: &KvStore| write_at < s.positions();
    match (keys, values) {
        (Some(k), Some(v)) if room(k) && room(v) => Some(FixedSlot {
            keys: k.clone(),
            values: v.clone(),
            write_at,
            valid,
        }),
        _ => None,
    }
}

/// Whether the buffers (if any) are of batch 1 and hold `format` (floats
/// still to be converted to it count).
fn fixed_ready(keys: &Option<KvStore>, values: &Option<KvStore>, format: CacheFormat) -> bool {
    let ready = |s: &Option<KvStore>, f: KvFormat| match s {
        None => true,
        Some(store) => {
            let batch = store
                .arrays()
                .first()
                .and_then(|a| a.shape().first().copied());
            let holds = matches!(store, KvStore::Float(_)) || store.format() == f;
            batch == Some(1) && holds
        }
    };
    ready(keys, format.keys) && ready(values, format.values)
}

/// Bytes held by a cache's key and value buffers.
pub(crate) fn pair_nbytes(keys: &Option<KvStore>, values: &Option<KvStore>) -> usize {
    keys.iter().chain(values.iter()).map(KvStore::nbytes).sum()
}
