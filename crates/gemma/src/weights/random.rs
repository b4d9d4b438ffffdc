//! Random weights of any configuration, created directly on the device, for
//! tests and for speed work where real weights cannot be carried.

use mlx_core::{random, Array, Dtype};

use super::tensors::{Tensor, TensorMap};
use crate::config::Gemma3Config;

/// Normally distributed weights (std 0.02; norms around 1) for `config`,
/// reproducible from `seed`.
pub fn random_tensors(
    config: &Gemma3Config,
    dtype: Dtype,
    seed: u64,
) -> mlx_core::Result<TensorMap> {
    let mut map = TensorMap::new(std::path::Path::new("<random weights>"), false);
    let mut key = random::key(seed)?;
    let mut add = |name: String, shape: &[i32], std: f32| -> mlx_core::Result<()> {
        let (next, sub) = random::split(&key)?;
        key = next;
        let a = random::normal(shape, dtype, 0.0, std, Some(&sub))?;
        map.tensors.insert(name, Tensor::Dense(a));
        Ok(())
    };
    let c = config;
    let (h, i, d) = (
        c.hidden_size as i32,
        c.intermediate_size as i32,
        c.head_dim as i32,
    );
    let (q, kv) = (
        c.num_attention_heads as i32 * d,
        c.num_key_value_heads as i32 * d,
    );
    add(
        "model.embed_tokens.weight".into(),
        &[c.vocab_size as i32, h],
        0.02,
    )?;
    add("model.norm.weight".into(), &[h], 0.1)?;
    for l in 0..c.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        add(p("self_attn.q_proj.weight"), &[q, h], 0.02)?;
        add(p("self_attn.k_proj.weight"), &[kv, h], 0.02)?;
        add(p("self_attn.v_proj.weight"), &[kv, h], 0.02)?;
        add(p("self_attn.o_proj.weight"), &[h, q], 0.02)?;
        add(p("self_attn.q_norm.weight"), &[d], 0.1)?;
        add(p("self_attn.k_norm.weight"), &[d], 0.1)?;
        add(p("mlp.gate_proj.weight"), &[i, h], 0.02)?;
        add(p("mlp.up_proj.weight"), &[i, h], 0.02)?;
        add(p("mlp.down_proj.weight"), &[h, i], 0.02)?;
        for norm in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            add(p(&format!("{norm}.weight")), &[h], 0.1)?;
        }
    }
    let arrays: Vec<&Array> = map
        .tensors
        .values()
        .filter_map(|t| match t {
            Tensor::Dense(a) => Some(a),
            Tensor::Quantized(_) | Tensor::Gguf(_) => None,
        })
        .collect();
    mlx_core::eval(&arrays)?;
    Ok(map)
}
