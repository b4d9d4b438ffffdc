//! The cache of a sliding-window layer: a ring buffer of the window size.

use mlx_core::{arange, Array, Dtype};

use super::buffers::{
    convert_stores, fixed_slot_of, pair_arrays, pair_nbytes, reserve_fixed_pair, round_up, Attend,
    CacheFormat, FixedSlot, KeyMask, QueryRounding, STEP,
};
use super::error::CacheError;
use super::format::{KvStore, VectorSpec};
use super::plain::causal_mask;

/// A sliding-window KV cache holding the last `window` tokens.
///
/// Single-token decoding writes into a ring buffer in place and attends to
/// the whole buffer (order does not matter to attention: RoPE is applied
/// before caching). A multi-token chunk attends to the last `window − 1`
/// cached tokens in temporal order followed by its own tokens, under a causal
/// mask limited to the window, then keeps the last `window` tokens.
#[derive(Debug, Clone)]
pub struct RotatingKvCache {
    format: CacheFormat,
    /// Tokens kept in the compute dtype before quantizing starts.
    start: i32,
    window: i32,
    keys: Option<KvStore>,
    values: Option<KvStore>,
    /// Tokens seen in all.
    offset: i32,
    /// Valid positions in the buffers (at most `window`).
    filled: i32,
    /// Where the next single token is written; when the buffer is full, the
    /// oldest token sits here.
    next: i32,
    queries: QueryRounding,
}

impl RotatingKvCache {
    /// An empty cache of `window` tokens storing keys and values in `format`.
    pub fn new(window: i32, format: CacheFormat) -> Result<RotatingKvCache, CacheError> {
        if window < 1 {
            return Err(CacheError::Format(format!(
                "sliding window {window} must be at least 1"
            )));
        }
        Ok(RotatingKvCache {
            format,
            start: 0,
            window,
            keys: None,
            values: None,
            offset: 0,
            filled: 0,
            next: 0,
            queries: QueryRounding::Exact,
        })
    }

    /// Treats the queries that attend to this cache as `queries` says (see
    /// [`crate::cache::LayerCache::round_queries`]).
    pub fn round_queries(mut self, queries: QueryRounding) -> RotatingKvCache {
        self.queries = queries;
        self
    }

    /// Keeps the compute dtype for the first `start` tokens (see
    /// [`crate::cache::LayerCache::quantize_from`]).
    pub fn quantize_from(mut self, start: i32) -> RotatingKvCache {
        self.start = start.max(0);
        self
    }

    /// Tokens seen so far.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// The window size.
    pub fn window(&self) -> i32 {
        self.window
    }

    /// Stores `keys` and `values` (`[B, heads, n, dim]`) and returns what the
    /// `n` new queries attend to.
    pub fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<Attend, CacheError> {
        let format = self.format.active(self.offset, self.start);
        convert_stores(&mut self.keys, &mut self.values, format)?;
        let (new_keys, new_values) = format.encode(keys, values)?;
        if keys.dim(2)? == 1 {
            self.update_one(new_keys, new_values)
        } else {
            self.update_many(new_keys, new_values)
        }
    }

    fn update_one(&mut self, new_keys: KvStore, new_values: KvStore) -> Result<Attend, CacheError> {
        let (mut k, mut v) = match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) => (k, v),
            _ => (
                KvStore::zeros_like(&new_keys, STEP.min(self.window))?,
                KvStore::zeros_like(&new_values, STEP.min(self.window))?,
            ),
        };
        if self.filled < self.window && self.filled >= k.positions() {
            let extra = (k.positions() + STEP).min(self.window) - k.positions();
            k = KvStore::concat(&[&k, &KvStore::zeros_like(&new_keys, extra)?])?;
            v = KvStore::concat(&[&v, &KvStore::zeros_like(&new_values, extra)?])?;
        }
        let at = self.next;
        let k = k.write(&new_keys, at)?;
        let v = v.write(&new_values, at)?;
        self.offset += 1;
        self.filled = (self.filled + 1).min(self.window);
        self.next = (at + 1) % self.window;
        let cap = k.positions();
        let attend = if self.filled == cap {
            Attend {
                keys: k.clone(),
                values: v.clone(),
                mask: KeyMask::All,
                queries: self.queries,
                rotation: self.format.rotation,
            }
        } else {
            Attend {
                keys: k.slice(0, self.filled)?,
                values: v.slice(0, self.filled)?,
                mask: KeyMask::All,
                queries: self.queries,
                rotation: self.format.rotation,
            }
        };
        self.keys = Some(k);
        self.values = Some(v);
        Ok(attend)
    }

    /// The valid cached positions in temporal order, at most the last `keep`.
    fn temporal(&self, store: &Option<KvStore>, keep: i32) -> Result<Option<KvStore>, CacheError> {
        let Some(store) = store else { return Ok(None) };
        if keep == 0 || self.filled == 0 {
            return Ok(None);
        }
        let ordered = if self.filled == self.window && self.next != 0 {
            KvStore::concat(&[
                &store.slice(self.next, self.window)?,
                &store.slice(0, self.next)?,
            ])?
        } else {
            store.slice(0, self.filled)?
        };
        let start = self.filled - keep.min(self.filled);
        Ok(Some(if start == 0 {
            ordered
        } else {
            ordered.slice(start, self.filled)?
        }))
    }

    fn update_many(
        &mut self,
        new_keys: KvStore,
        new_values: KvStore,
    ) -> Result<Attend, CacheError> {
        let n = new_keys.positions();
        let keep = (self.window - 1).min(self.filled);
        let old_keys = self.temporal(&self.keys, keep)?;
        let old_values = self.temporal(&self.values, keep)?;
        let (all_keys, all_values) = match (old_keys, old_values) {
            (Some(k), Some(v)) => (
                KvStore::concat(&[&k, &new_keys])?,
                KvStore::concat(&[&v, &new_values])?,
            ),
            _ => (new_keys, new_values),
        };
        let total = keep + n;
        let window_binds = total > self.window;
        let mask = if window_binds {
            KeyMask::Array(window_mask(n, keep, total, self.window)?)
        } else {
            KeyMask::Causal
        };
        let (attend_keys, attend_values) = (all_keys.clone(), all_values.clone());

        let kept = total.min(self.window);
        let (k, v) = if kept < total {
            (
                all_keys.slice(total - kept, total)?,
                all_values.slice(total - kept, total)?,
            )
        } else {
            (all_keys, all_values)
        };
        let cap = if kept == self.window {
            self.window
        } else {
            round_up(kept).min(self.window)
        };
        let (k, v) = if cap > kept {
            (
                KvStore::concat(&[&k, &KvStore::zeros_like(&k, cap - kept)?])?,
                KvStore::concat(&[&v, &KvStore::zeros_like(&v, cap - kept)?])?,
            )
        } else {
            (k, v)
        };
        self.keys = Some(k);
        self.values = Some(v);
        self.offset += n;
        self.filled = kept;
        self.next = kept % self.window;
        Ok(Attend {
            keys: attend_keys,
            values: attend_values,
            mask,
            queries: self.queries,
            rotation: self.format.rotation,
        })
    }

    /// See [`crate::cache::LayerCache::reserve_fixed`]: buffers of `positions`
    /// rounded up to whole steps, at most the window.
    pub fn reserve_fixed(&mut self, positions: i32, spec: VectorSpec) -> Result<bool, CacheError> {
        if self.queries != QueryRounding::Exact || self.format.rotation.any() {
            return Ok(false);
        }
        let last = positions.max(self.offset + 1) - 1;
        let formats = (
            self.format.active(self.offset, self.start),
            self.format.active(last, self.start),
        );
        let capacity = round_up(last + 1).min(self.window);
        reserve_fixed_pair(&mut self.keys, &mut self.values, formats, capacity, spec)
    }

    /// See [`crate::cache::LayerCache::fixed_slot`]: the next token goes into the
    /// ring at `next`; until the ring is full the valid positions are the
    /// leading `filled` ones, and `next == filled`.
    pub fn fixed_slot(&self) -> Option<FixedSlot> {
        let format = self.format.active(self.offset, self.start);
        let valid = (self.filled + 1).min(self.window);
        fixed_slot_of(&self.keys, &self.values, format, self.next, valid)
    }

    /// See [`crate::cache::LayerCache::commit_fixed`].
    pub fn commit_fixed(&mut self, keys: KvStore, values: KvStore) {
        self.keys = Some(keys);
        self.values = Some(values);
        self.offset += 1;
        self.filled = (self.filled + 1).min(self.window);
        self.next = (self.next + 1) % self.window;
    }

    /// Forgets the last `n` tokens while every kept token is still in the
    /// buffer (before the window has wrapped); returns how many were forgotten.
    pub fn trim(&mut self, n: i32) -> i32 {
        // Once a token has left the window, earlier states are gone.
        if self.offset > self.filled {
            return 0;
        }
        let n = n.clamp(0, self.filled);
        self.offset -= n;
        self.filled -= n;
        self.next = self.filled % self.window;
        n
    }

    /// Bytes held by the buffers.
    pub fn nbytes(&self) -> usize {
        pair_nbytes(&self.keys, &self.values)
    }

    /// The arrays held.
    pub fn arrays(&self) -> Vec<&Array> {
        pair_arrays(&self.keys, &self.values)
    }
}

/// `[n, keys]` mask for `n` queries after `keep` cached tokens: query i sees
/// key j when j ≤ keep + i < j + window (and j < keep + n).
fn window_mask(n: i32, keep: i32, keys: i32, window: i32) -> Result<Array, CacheError> {
    let causal = causal_mask(n, keep, keys)?;
    let rows = arange(keep as f64, (keep + n) as f64, 1.0, Dtype::Int32)?.reshape(&[n, 1])?;
    let cols =
        arange(window as f64, (keys + window) as f64, 1.0, Dtype::Int32)?.reshape(&[1, keys])?;
    Ok(causal.logical_and(&rows.less(&cols)?)?)
}
