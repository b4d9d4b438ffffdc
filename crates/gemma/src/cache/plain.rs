//! The cache of a global layer: every position kept, buffers grown in steps.

use mlx_core::{arange, Array, Dtype};

use super::buffers::{
    convert_stores, fixed_slot_of, pair_arrays, pair_nbytes, reserve_fixed_pair, round_up, Attend,
    CacheFormat, FixedSlot, KeyMask, QueryRounding,
};
use super::error::CacheError;
use super::format::{KvStore, VectorSpec};

/// A growing KV cache. Buffers grow by whole steps of 256 positions, so
/// decoding does not re-allocate per token.
///
/// Keys and values, quantized or not, are returned sliced to the tokens seen.
#[derive(Debug, Clone)]
pub struct KvCache {
    format: CacheFormat,
    /// Tokens kept in the compute dtype before quantizing starts.
    start: i32,
    keys: Option<KvStore>,
    values: Option<KvStore>,
    offset: i32,
    queries: QueryRounding,
}

impl KvCache {
    /// An empty cache storing keys and values in `format`.
    pub fn new(format: CacheFormat) -> KvCache {
        KvCache {
            format,
            start: 0,
            keys: None,
            values: None,
            offset: 0,
            queries: QueryRounding::Exact,
        }
    }

    /// Treats the queries that attend to this cache as `queries` says (see
    /// [`crate::cache::LayerCache::round_queries`]).
    pub fn round_queries(mut self, queries: QueryRounding) -> KvCache {
        self.queries = queries;
        self
    }

    /// Keeps the compute dtype for the first `start` tokens (see
    /// [`crate::cache::LayerCache::quantize_from`]).
    pub fn quantize_from(mut self, start: i32) -> KvCache {
        self.start = start.max(0);
        self
    }

    /// Tokens stored.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Stores `keys` and `values` (`[B, heads, n, dim]`) after the tokens seen.
    pub fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<Attend, CacheError> {
        let n = keys.dim(2)?;
        let prev = self.offset;
        let format = self.format.active(prev, self.start);
        convert_stores(&mut self.keys, &mut self.values, format)?;
        let (new_keys, new_values) = format.encode(keys, values)?;
        let (stored_keys, stored_values) = match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) => (k, v),
            _ => {
                let cap = round_up(n);
                (
                    KvStore::zeros_like(&new_keys, cap)?,
                    KvStore::zeros_like(&new_values, cap)?,
                )
            }
        };
        let (stored_keys, stored_values) = (
            grow(stored_keys, &new_keys, prev, n)?,
            grow(stored_values, &new_values, prev, n)?,
        );
        let stored_keys = stored_keys.write(&new_keys, prev)?;
        let stored_values = stored_values.write(&new_values, prev)?;
        self.offset = prev + n;
        let attend = self.attend(&stored_keys, &stored_values, n)?;
        self.keys = Some(stored_keys);
        self.values = Some(stored_values);
        Ok(attend)
    }

    /// What `n` new queries attend to, given the updated buffers: the
    /// positions written so far, causally masked for a chunk.
    fn attend(&self, keys: &KvStore, values: &KvStore, n: i32) -> Result<Attend, CacheError> {
        let (keys, values) = if self.offset < keys.positions() {
            (keys.slice(0, self.offset)?, values.slice(0, self.offset)?)
        } else {
            (keys.clone(), values.clone())
        };
        let mask = if n > 1 { KeyMask::Causal } else { KeyMask::All };
        Ok(Attend {
            keys,
            values,
            mask,
            queries: self.queries,
            rotation: self.format.rotation,
        })
    }

    /// See [`crate::cache::LayerCache::reserve_fixed`]: buffers of `positions`
    /// rounded up to whole steps.
    pub fn reserve_fixed(&mut self, positions: i32, spec: VectorSpec) -> Result<bool, CacheError> {
        if self.queries != QueryRounding::Exact || self.format.rotation.any() {
            return Ok(false);
        }
        let last = positions.max(self.offset + 1) - 1;
        let formats = (
            self.format.active(self.offset, self.start),
            self.format.active(last, self.start),
        );
        let capacity = round_up(last + 1);
        reserve_fixed_pair(&mut self.keys, &mut self.values, formats, capacity, spec)
    }

    /// See [`crate::cache::LayerCache::fixed_slot`]: the next token goes after the
    /// tokens held, and every position up to it is valid.
    pub fn fixed_slot(&self) -> Option<FixedSlot> {
        let format = self.format.active(self.offset, self.start);
        fixed_slot_of(
            &self.keys,
            &self.values,
            format,
            self.offset,
            self.offset + 1,
        )
    }

    /// See [`crate::cache::LayerCache::commit_fixed`].
    pub fn commit_fixed(&mut self, keys: KvStore, values: KvStore) {
        self.keys = Some(keys);
        self.values = Some(values);
        self.offset += 1;
    }

    /// Forgets the last `n` tokens; returns how many were forgotten.
    pub fn trim(&mut self, n: i32) -> i32 {
        let n = n.clamp(0, self.offset);
        self.offset -= n;
        n
    }

    /// Bytes held by the buffers.
    pub fn nbytes(&self) -> usize {
        pair_nbytes(&self.keys, &self.values)
    }

    /// Positions the buffers hold room for.
    pub fn capacity(&self) -> i32 {
        self.keys.as_ref().map_or(0, KvStore::positions)
    }

    /// The arrays held.
    pub fn arrays(&self) -> Vec<&Array> {
        pair_arrays(&self.keys, &self.values)
    }
}

/// The buffer, grown by whole steps if `n` more positions after `prev` do not fit.
fn grow(stored: KvStore, like: &KvStore, prev: i32, n: i32) -> Result<KvStore, CacheError> {
    let cap = stored.positions();
    if prev + n <= cap {
        return Ok(stored);
    }
    let kept = stored.slice(0, prev)?;
    let extra = KvStore::zeros_like(like, round_up(prev + n) - prev)?;
    KvStore::concat(&[&kept, &extra])
}

/// `[n, keys]` boolean mask: query i (at position `start + i`) sees keys at
/// positions ≤ `start + i`.
pub(crate) fn causal_mask(n: i32, start: i32, keys: i32) -> Result<Array, CacheError> {
    let rows = arange(start as f64, (start + n) as f64, 1.0, Dtype::Int32)?.reshape(&[n, 1])?;
    let cols = arange(0.0, keys as f64, 1.0, Dtype::Int32)?.reshape(&[1, keys])?;
    Ok(rows.greater_equal(&cols)?)
}
