//! What every [`Gemma3Config`] a reader returns must satisfy, whether it
//! came from a `config.json` or from GGUF metadata.

use gemma::config::Gemma3Config;

/// Asserts the values the forward pass relies on: sizes at least 1, query
/// heads a multiple of key/value heads, positive finite floats, quantization
/// parameters at least 1; and that the derived values are usable.
pub fn check(c: &Gemma3Config) {
    let sizes = [
        c.vocab_size,
        c.hidden_size,
        c.intermediate_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.sliding_window,
        c.sliding_window_pattern,
        c.max_position_embeddings,
    ];
    assert!(sizes.iter().all(|&s| s >= 1), "a size is 0: {c:?}");
    assert_eq!(c.num_attention_heads % c.num_key_value_heads, 0, "{c:?}");
    let floats = [
        Some(c.rms_norm_eps),
        Some(c.rope_theta),
        Some(c.rope_local_base_freq),
        Some(c.query_pre_attn_scalar),
        c.rope_scaling,
        c.final_logit_softcapping,
        c.attn_logit_softcapping,
    ];
    for v in floats.into_iter().flatten() {
        assert!(v.is_finite() && v > 0.0, "float {v}: {c:?}");
    }
    let scale = c.attention_scale();
    assert!(
        scale.is_finite() && scale >= 0.0,
        "attention scale {scale}: {c:?}"
    );
    for layer in [0, c.num_hidden_layers - 1, usize::MAX - 1] {
        let _ = c.is_sliding(layer);
    }
    if let Some(q) = &c.quantization {
        assert!(q.group_size >= 1 && q.bits >= 1, "{q:?}");
        for layer in q.overrides.values().flatten() {
            assert!(layer.group_size >= 1 && layer.bits >= 1, "{layer:?}");
        }
    }
}
