//! Writing a loaded checkpoint as a Hugging Face-style folder that mlx-lm
//! (and transformers) load: `config.json`, `model.safetensors`,
//! `tokenizer.json` and `tokenizer_config.json` with the chat template.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_core::{Array, Dtype};
use safetensors::tensor::TensorView;

use crate::chat_template::GEMMA3_CHAT_TEMPLATE;
use crate::config::Gemma3Config;
use crate::load::{read_checkpoint, ModelSource, WeightStorage};
use crate::tokenizer::Tokenizer;
use crate::weights::{Tensor, TensorMap};

/// A failure to write the folder.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// A file could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ConvertError + '_ {
    move |source| ConvertError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The `config.json` of a `gemma3_text` model with `config`'s values.
pub fn hf_config_json(config: &Gemma3Config) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_local_base_freq": config.rope_local_base_freq,
        "rope_scaling": config.rope_scaling.map(|f| serde_json::json!({"rope_type": "linear", "factor": f})),
        "sliding_window": config.sliding_window,
        "sliding_window_pattern": config.sliding_window_pattern,
        // transformers insists on an integer here (all released sizes have one).
        "query_pre_attn_scalar": whole_or_float(config.query_pre_attn_scalar),
        "max_position_embeddings": config.max_position_embeddings,
        "final_logit_softcapping": null,
        "attn_logit_softcapping": null,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": true,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_ids,
        "pad_token_id": config.pad_token_id,
        "torch_dtype": "float32",
    })
}

/// `value` as a JSON integer when it is whole, else as a float.
fn whole_or_float(value: f32) -> serde_json::Value {
    if value.fract() == 0.0 && value.abs() < 1e9 {
        serde_json::json!(value as i64)
    } else {
        serde_json::json!(value)
    }
}

fn safetensors_dtype(dtype: Dtype) -> Result<safetensors::Dtype, ConvertError> {
    Ok(match dtype {
        Dtype::Float32 => safetensors::Dtype::F32,
        Dtype::Float16 => safetensors::Dtype::F16,
        Dtype::Bfloat16 => safetensors::Dtype::BF16,
        Dtype::Uint32 => safetensors::Dtype::U32,
        other => return Err(ConvertError::Other(format!("cannot write {other} tensors"))),
    })
}

/// The host bytes of an array (its own dtype, row-major).
fn host_bytes(a: &Array) -> Result<Vec<u8>, ConvertError> {
    let err = |e: mlx_core::Error| ConvertError::Other(e.to_string());
    Ok(match a.dtype() {
        Dtype::Float32 => a
            .to_vec::<f32>()
            .map_err(err)?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        Dtype::Uint32 => a
            .to_vec::<u32>()
            .map_err(err)?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        Dtype::Float16 => a
            .to_vec::<half::f16>()
            .map_err(err)?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        Dtype::Bfloat16 => a
            .to_vec::<half::bf16>()
            .map_err(err)?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        other => return Err(ConvertError::Other(format!("cannot write {other} tensors"))),
    })
}

/// Reads `source` in `dtype` and writes it as a Hugging Face-style folder.
pub fn convert(
    source: &ModelSource,
    dtype: Dtype,
    out: &Path,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(), ConvertError> {
    let checkpoint = read_checkpoint(source, dtype, WeightStorage::Dequantized, progress)
        .map_err(|e| ConvertError::Other(e.to_string()))?;
    write_hf_folder(
        &checkpoint.tensors,
        &checkpoint.config,
        checkpoint.tokenizer.as_ref(),
        out,
    )
}

/// Writes `tensors` (Hugging Face names) as `out/model.safetensors`, with
/// RMSNorm weights stored without Gemma's `1 +` (the Hugging Face
/// convention), plus `config.json` and, when given, the tokenizer files.
pub fn write_hf_folder(
    tensors: &TensorMap,
    config: &Gemma3Config,
    tokenizer: Option<&Tokenizer>,
    out: &Path,
) -> Result<(), ConvertError> {
    std::fs::create_dir_all(out).map_err(io(out))?;
    let mut host: Vec<(String, Vec<i32>, Dtype, Vec<u8>)> = Vec::new();
    let mut push = |name: String, a: &Array| -> Result<(), ConvertError> {
        host.push((name, a.shape(), a.dtype(), host_bytes(a)?));
        Ok(())
    };
    for (name, tensor) in &tensors.tensors {
        match tensor {
            Tensor::Dense(a) if tensors.norms_include_one && name.ends_with("norm.weight") => {
                let one = Array::scalar(1.0, a.dtype())
                    .map_err(|e| ConvertError::Other(e.to_string()))?;
                push(
                    name.clone(),
                    &a.subtract(&one)
                        .map_err(|e| ConvertError::Other(e.to_string()))?,
                )?
            }
            Tensor::Dense(a) => push(name.clone(), a)?,
            Tensor::Gguf(g) => push(
                name.clone(),
                &g.dequantized()
                    .map_err(|e| ConvertError::Other(e.to_string()))?,
            )?,
            Tensor::Quantized(q) => {
                let stem = name.trim_end_matches(".weight");
                push(name.clone(), &q.packed)?;
                push(format!("{stem}.scales"), &q.scales)?;
                push(format!("{stem}.biases"), &q.biases)?;
            }
        }
    }
    let views = host
        .iter()
        .map(|(name, shape, dtype, bytes)| {
            let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            TensorView::new(safetensors_dtype(*dtype)?, shape, bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| ConvertError::Other(format!("tensor '{name}': {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let weights = out.join("model.safetensors");
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), &weights)
        .map_err(|e| ConvertError::Other(format!("{}: {e}", weights.display())))?;

    let mut json = hf_config_json(config);
    if let Some(q) = &config.quantization {
        json["quantization"] = serde_json::json!({"group_size": q.group_size, "bits": q.bits});
    }
    let config_path = out.join("config.json");
    std::fs::write(
        &config_path,
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    )
    .map_err(io(&config_path))?;

    // mlx-lm reads its stop tokens from here (config.json's list is ignored).
    let generation = serde_json::json!({
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_ids,
        "pad_token_id": config.pad_token_id,
    });
    let generation_path = out.join("generation_config.json");
    std::fs::write(
        &generation_path,
        serde_json::to_string_pretty(&generation).unwrap_or_default(),
    )
    .map_err(io(&generation_path))?;

    if let Some(tokenizer) = tokenizer {
        let tokenizer_path = out.join("tokenizer.json");
        tokenizer
            .save(&tokenizer_path)
            .map_err(|e| ConvertError::Other(e.to_string()))?;
        let tokenizer_config = serde_json::json!({
            "add_bos_token": true,
            "add_eos_token": false,
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "chat_template": GEMMA3_CHAT_TEMPLATE,
            "tokenizer_class": "GemmaTokenizerFast",
            "model_max_length": config.max_position_embeddings,
            "clean_up_tokenization_spaces": false,
        });
        let path = out.join("tokenizer_config.json");
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&tokenizer_config).unwrap_or_default(),
        )
        .map_err(io(&path))?;
    }
    Ok(())
}
