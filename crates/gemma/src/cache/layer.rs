//! The cache of one layer, of either kind.

use mlx_core::Array;

use super::buffers::{Attend, FixedSlot, QueryRounding};
use super::error::CacheError;
use super::format::{KvStore, VectorSpec};
use super::plain::KvCache;
use super::rotating::RotatingKvCache;

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

    /// Treats the queries that attend to this cache as `queries` says;
    /// a cache that rounds them is not reserved for fixed-shape steps (see
    /// [`LayerCache::reserve_fixed`]) and decodes eagerly.
    pub fn round_queries(self, queries: QueryRounding) -> LayerCache {
        match self {
            LayerCache::Plain(c) => LayerCache::Plain(c.round_queries(queries)),
            LayerCache::Rotating(c) => LayerCache::Rotating(c.round_queries(queries)),
        }
    }

    /// Readies the cache for fixed-shape single-token steps until it holds
    /// `positions` tokens: buffers of batch 1 in its format, grown to their
    /// final capacity. Returns false, changing nothing, when its format
    /// changes before then (it keeps floats until `start`), it holds a
    /// batch of several, or it rounds queries.
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
