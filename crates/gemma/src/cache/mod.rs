//! KV caches: one per layer, chosen in [`crate::model::Gemma3::make_caches`].
//!
//! - [`KvCache`] (global layers): grows in steps of [`STEP`] positions.
//! - [`RotatingKvCache`] (sliding layers): a ring buffer of the window size.
//!
//! Both store keys and values in any [`KvFormat`] — floats, MLX affine
//! quantization or TurboQuant ([`turbo`]), with independent formats for keys
//! and values — so a
//! "quantized cache" is either kind with a quantized format: quantization is a
//! storage format ([`KvStore`]), not a third kind of cache. Vectors are encoded
//! as they enter, so the queries of a prefill chunk attend to the stored
//! (possibly quantized) keys and values, their own included.

mod format;
mod plain;
mod rotating;
pub mod turbo;

pub use format::{KvFormat, KvStore};
pub use plain::KvCache;
pub use rotating::RotatingKvCache;
pub use turbo::TurboArray;

use mlx_core::{Array, Dtype};

/// Positions are allocated in multiples of this many.
pub const STEP: i32 = 256;

/// Errors of cache bookkeeping.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// A format or argument the cache cannot take.
    #[error("KV cache: {0}")]
    Format(String),
}

/// The formats of one cache's keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheFormat {
    /// How keys are stored.
    pub keys: KvFormat,
    /// How values are stored.
    pub values: KvFormat,
}

impl CacheFormat {
    /// Keys and values unquantized in the compute dtype.
    pub const COMPUTE: CacheFormat = CacheFormat {
        keys: KvFormat::Float(None),
        values: KvFormat::Float(None),
    };

    /// The format in effect after `offset` tokens when the cache keeps the
    /// compute dtype until `start` tokens (mlx-lm's `quantized_kv_start`).
    pub fn active(&self, offset: i32, start: i32) -> CacheFormat {
        if offset < start {
            CacheFormat::COMPUTE
        } else {
            *self
        }
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
/// ([`crate::decode_step::DecodeStep`]): keys and values of
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

/// The shape and dtype of key and value buffers a cache creates when it has
/// none yet.
#[derive(Debug, Clone, Copy)]
pub struct VectorSpec {
    /// Key/value heads.
    pub heads: i32,
    /// Features per head.
    pub dim: i32,
    /// The compute dtype (used where the format keeps it).
    pub dtype: Dtype,
}

/// What attention reads after a cache update: the keys and values to attend
/// to and the mask over them.
#[derive(Debug, Clone)]
pub struct Attend {
    /// Keys, `[B, heads, keys, dim]` in the cache's format.
    pub keys: KvStore,
    /// Values, `[B, heads, keys, dim]` in the cache's format.
    pub values: KvStore,
    /// The mask.
    pub mask: KeyMask,
}

/// The cache of one layer.
#[derive(Debug, Clone)]
pub enum LayerCache {
    /// A global layer's cache.
    Plain(KvCache),
    /// A sliding layer's cache.
    Rotating(RotatingKvCache),
}

impl LayerCache {
    /// Stores `keys` and `values` (`[B, heads, n, dim]`, RoPE applied) and
    /// returns what this step's queries attend to.
    pub fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<Attend, CacheError> {
        match self {
            LayerCache::Plain(c) => c.update_and_fetch(keys, values),
            LayerCache::Rotating(c) => c.update_and_fetch(keys, values),
        }
    }

    /// Keeps keys and values in the compute dtype for the first `start`
    /// tokens; when the cache reaches `start` tokens everything stored is
    /// quantized and later tokens are quantized as they enter (mlx-lm's
    /// `quantized_kv_start`).
    pub fn quantize_from(self, start: i32) -> LayerCache {
        match self {
            LayerCache::Plain(c) => LayerCache::Plain(c.quantize_from(start)),
            LayerCache::Rotating(c) => LayerCache::Rotating(c.quantize_from(start)),
        }
    }

    /// Readies the cache for fixed-shape single-token steps until it holds
    /// `positions` tokens: buffers of batch 1 in its format, grown to their
    /// final capacity. Returns false, changing nothing, when its format
    /// changes before then (it keeps floats until `start`), or it holds a
    /// batch of several.
    pub fn reserve_fixed(&mut self, positions: i32, spec: VectorSpec) -> Result<bool, CacheError> {
        match self {
            LayerCache::Plain(c) => c.reserve_fixed(positions, spec),
            LayerCache::Rotating(c) => c.reserve_fixed(positions, spec),
        }
    }

    /// The buffers and positions of the next fixed-shape step, or `None`
    /// when the cache is not reserved for it (see
    /// [`LayerCache::reserve_fixed`]) or its buffers are full.
    pub fn fixed_slot(&self) -> Option<FixedSlot> {
        match self {
            LayerCache::Plain(c) => c.fixed_slot(),
            LayerCache::Rotating(c) => c.fixed_slot(),
        }
    }

    /// Takes the buffers a fixed-shape step wrote one token into (at the
    /// slot [`LayerCache::fixed_slot`] gave) and counts the token.
    pub fn commit_fixed(&mut self, keys: KvStore, values: KvStore) {
        match self {
            LayerCache::Plain(c) => c.commit_fixed(keys, values),
            LayerCache::Rotating(c) => c.commit_fixed(keys, values),
        }
    }

    /// Tokens seen so far (the RoPE position of the next token).
    pub fn offset(&self) -> i32 {
        match self {
            LayerCache::Plain(c) => c.offset(),
            LayerCache::Rotating(c) => c.offset(),
        }
    }

    /// Forgets the last `n` tokens; returns how many were forgotten (fewer
    /// when the cache cannot go back that far).
    pub fn trim(&mut self, n: i32) -> i32 {
        match self {
            LayerCache::Plain(c) => c.trim(n),
            LayerCache::Rotating(c) => c.trim(n),
        }
    }

    /// Bytes held by the cache's arrays.
    pub fn nbytes(&self) -> usize {
        match self {
            LayerCache::Plain(c) => c.nbytes(),
            LayerCache::Rotating(c) => c.nbytes(),
        }
    }

    /// The arrays held, for evaluation together with the logits.
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            LayerCache::Plain(c) => c.arrays(),
            LayerCache::Rotating(c) => c.arrays(),
        }
    }
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
/// [`LayerCache::reserve_fixed`]): false, changing nothing, unless the
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
/// [`LayerCache::fixed_slot`]): `None` unless both are of batch 1 with room
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
