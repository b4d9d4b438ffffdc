//! One transformer block's weights as plain data, and its head layout.

use mlx_core::Array;

use crate::linear::Linear;

/// One transformer block's weights.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Pre-attention RMSNorm weight (1 + w).
    pub input_norm: Array,
    /// Fused `[q; k; v]` projection, `[(Hq + 2·Hkv)·D, hidden]`.
    pub qkv_proj: Linear,
    /// Output projection, `[hidden, Hq·D]`.
    pub o_proj: Linear,
    /// Per-head query RMSNorm weight (1 + w).
    pub q_norm: Array,
    /// Per-head key RMSNorm weight (1 + w).
    pub k_norm: Array,
    /// Post-attention RMSNorm weight (1 + w).
    pub post_attention_norm: Array,
    /// Pre-MLP RMSNorm weight (1 + w).
    pub pre_feedforward_norm: Array,
    /// Fused `[gate; up]` projection, `[2·intermediate, hidden]`.
    pub gate_up_proj: Linear,
    /// Down projection, `[hidden, intermediate]`.
    pub down_proj: Linear,
    /// Post-MLP RMSNorm weight (1 + w).
    pub post_feedforward_norm: Array,
}

impl Layer {
    /// Every weight array of the block.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.norms().to_vec();
        for p in self.projections() {
            out.extend(p.arrays());
        }
        out
    }

    /// The six norms' weights: input, q, k, post-attention, pre- and
    /// post-feedforward.
    pub fn norms(&self) -> [&Array; 6] {
        [
            &self.input_norm,
            &self.q_norm,
            &self.k_norm,
            &self.post_attention_norm,
            &self.pre_feedforward_norm,
            &self.post_feedforward_norm,
        ]
    }

    /// The four projections: Q/K/V, output, gate/up, down.
    pub fn projections(&self) -> [&Linear; 4] {
        [
            &self.qkv_proj,
            &self.o_proj,
            &self.gate_up_proj,
            &self.down_proj,
        ]
    }
}

/// The block's head layout and constants.
#[derive(Debug, Clone, Copy)]
pub struct LayerGeometry {
    /// Query heads.
    pub heads: i32,
    /// Key/value heads.
    pub kv_heads: i32,
    /// Features per head.
    pub head_dim: i32,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Attention scale.
    pub scale: f32,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// RoPE position multiplier.
    pub rope_scale: f32,
}
