//! Where a block's new keys and values go during a forward pass: a layer
//! cache (the eager pass) or the fixed-capacity buffers of the compiled
//! decode step. The model writes through it; the decode step builds it.

use mlx_core::fast::RopeOffset;
use mlx_core::Array;

use crate::cache::{
    Attend, CacheError, KeyMask, KvStore, LayerCache, LayerKv, QueryRounding, Rotation,
};

/// Where one block's new keys and values go, and what its queries then
/// attend to.
pub(crate) enum KvTarget<'a> {
    /// A layer cache (the eager forward pass, any shapes).
    Cache(&'a mut LayerCache),
    /// Fixed-capacity buffers written at a position held in an array (the
    /// compiled decode step).
    Fixed(FixedTarget<'a>),
}

impl KvTarget<'_> {
    /// The RoPE position of the first new token.
    pub(crate) fn rope_offset(&self) -> RopeOffset<'_> {
        match self {
            KvTarget::Cache(c) => RopeOffset::Fixed(c.offset()),
            KvTarget::Fixed(f) => RopeOffset::Dynamic(f.position),
        }
    }

    /// Stores keys and values `[B, Hkv, L, D]`; returns what to attend to.
    pub(crate) fn update(&mut self, keys: &Array, values: &Array) -> Result<Attend, CacheError> {
        Ok(match self {
            KvTarget::Cache(c) => c.update_and_fetch(keys, values)?,
            KvTarget::Fixed(f) => f.update(keys, values)?,
        })
    }
}

/// One layer's keys and values in a fixed-shape step: buffers written at
/// `write_at`, attended to on their first `valid` positions (`mask` says the
/// same as an additive mask).
pub(crate) struct FixedTarget<'a> {
    /// The key buffers.
    pub(crate) keys: KvStore,
    /// The value buffers.
    pub(crate) values: KvStore,
    /// The RoPE position of the token.
    pub(crate) position: &'a Array,
    /// The buffer slot the token goes to.
    pub(crate) write_at: &'a Array,
    /// Valid leading positions after the write.
    pub(crate) valid: &'a Array,
    /// The same as an additive `[1, capacity]` mask.
    pub(crate) mask: &'a Array,
}

impl FixedTarget<'_> {
    /// The stores and positions as the fused decode-layer kernel takes
    /// them (it writes the stores in place, so they stay this target's).
    pub(crate) fn layer_kv(&self) -> LayerKv<'_> {
        LayerKv {
            keys: &self.keys,
            values: &self.values,
            position: self.position,
            write_at: self.write_at,
            valid: self.valid,
        }
    }

    /// Writes one token's keys and values `[1, Hkv, 1, D]` into the buffers,
    /// encoded in their format (cast to their dtype for floats); returns the
    /// whole buffers under the mask.
    pub(crate) fn update(&mut self, keys: &Array, values: &Array) -> Result<Attend, CacheError> {
        let write = |buffer: &KvStore, new: &Array| -> Result<KvStore, CacheError> {
            buffer.write_dynamic(&KvStore::encode(new, buffer.format())?, self.write_at)
        };
        self.keys = write(&self.keys, keys)?;
        self.values = write(&self.values, values)?;
        Ok(Attend {
            keys: self.keys.clone(),
            values: self.values.clone(),
            mask: KeyMask::Leading {
                valid: self.valid.clone(),
                additive: self.mask.clone(),
            },
            queries: QueryRounding::Exact,
            rotation: Rotation::NONE,
        })
    }
}
