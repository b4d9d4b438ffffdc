//! llama.cpp's GGUF tensor names for Gemma 3, mapped to Hugging Face names.

/// The Hugging Face name of a GGUF tensor, or `None` for a name Gemma 3 does
/// not use.
pub fn hf_name(gguf: &str) -> Option<String> {
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (index, part) = rest.split_once('.')?;
    let index: usize = index.parse().ok()?;
    let hf = match part {
        "attn_norm.weight" => "input_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{index}.{hf}"))
}

#[cfg(test)]
mod tests {
    use super::hf_name;

    #[test]
    fn maps_layer_and_global_names() {
        assert_eq!(
            hf_name("token_embd.weight").as_deref(),
            Some("model.embed_tokens.weight")
        );
        assert_eq!(
            hf_name("blk.17.ffn_norm.weight").as_deref(),
            Some("model.layers.17.pre_feedforward_layernorm.weight")
        );
        assert_eq!(
            hf_name("blk.3.attn_output.weight").as_deref(),
            Some("model.layers.3.self_attn.o_proj.weight")
        );
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
        assert_eq!(hf_name("rope_freqs.weight"), None);
    }
}
