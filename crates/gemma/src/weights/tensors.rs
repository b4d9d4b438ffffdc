//! A checkpoint's tensors by Hugging Face name, and their assembly into a
//! [`Gemma3`] model: the one place that knows which tensor goes where.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::{concatenate, Array, Dtype, QuantizedArray};

use crate::config::Gemma3Config;
use crate::linear::{GgufMatrix, Linear};
use crate::model::{Gemma3, Layer};

/// One tensor of a checkpoint.
#[derive(Debug, Clone)]
pub enum Tensor {
    /// Plain values.
    Dense(Array),
    /// MLX affine-quantized values.
    Quantized(QuantizedArray),
    /// GGUF blocks as stored.
    Gguf(GgufMatrix),
}

/// A failure to turn a checkpoint's tensors into a model.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// A tensor the model needs is not in the checkpoint.
    #[error("{}: missing tensor '{name}'", file.display())]
    Missing {
        /// The checkpoint.
        file: PathBuf,
        /// The tensor's (Hugging Face) name.
        name: String,
    },
    /// A tensor has a shape the configuration does not allow.
    #[error("{}: tensor '{name}' has shape {found:?}, the configuration needs {expected:?}", file.display())]
    Shape {
        /// The checkpoint.
        file: PathBuf,
        /// The tensor's name.
        name: String,
        /// Its shape.
        found: Vec<i32>,
        /// The shape the configuration implies.
        expected: Vec<i32>,
    },
    /// Anything else wrong with the checkpoint.
    #[error("{}: {message}", file.display())]
    Invalid {
        /// The checkpoint.
        file: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
}

/// Tensors by Hugging Face name (`model.layers.3.self_attn.q_proj.weight`).
#[derive(Debug)]
pub struct TensorMap {
    /// Where they came from, for error messages.
    pub file: PathBuf,
    /// The tensors.
    pub tensors: BTreeMap<String, Tensor>,
    /// Whether RMSNorm weights already include Gemma's `1 +` (GGUF files made
    /// by llama.cpp's converter do; Hugging Face checkpoints do not).
    pub norms_include_one: bool,
}

impl TensorMap {
    /// An empty map for tensors read from `file`.
    pub fn new(file: &Path, norms_include_one: bool) -> TensorMap {
        TensorMap {
            file: file.to_path_buf(),
            tensors: BTreeMap::new(),
            norms_include_one,
        }
    }

    fn take(&mut self, name: &str) -> Result<Tensor, WeightsError> {
        self.tensors
            .remove(name)
            .ok_or_else(|| WeightsError::Missing {
                file: self.file.clone(),
                name: name.to_string(),
            })
    }

    fn check_shape(
        &self,
        name: &str,
        found: Vec<i32>,
        expected: &[i32],
    ) -> Result<(), WeightsError> {
        if found != expected {
            return Err(WeightsError::Shape {
                file: self.file.clone(),
                name: name.to_string(),
                found,
                expected: expected.to_vec(),
            });
        }
        Ok(())
    }

    /// An RMSNorm weight of `dim` values, with the `1 +` folded in, in `dtype`.
    fn norm(&mut self, name: &str, dim: usize, dtype: Dtype) -> Result<Array, WeightsError> {
        let w = match self.take(name)? {
            Tensor::Dense(w) => w,
            Tensor::Quantized(q) => q.dequantize()?,
            Tensor::Gguf(g) => g.dequantized()?,
        };
        self.check_shape(name, w.shape(), &[dim as i32])?;
        let w = w.astype(dtype)?;
        Ok(if self.norms_include_one {
            w
        } else {
            w.add(&Array::scalar(1.0, dtype)?)?
        })
    }

    /// A projection `[out, in]` in `dtype` (quantized ones stay quantized).
    fn linear(
        &mut self,
        name: &str,
        out: usize,
        inp: usize,
        dtype: Dtype,
    ) -> Result<Linear, WeightsError> {
        match self.take(name)? {
            Tensor::Dense(w) => {
                self.check_shape(name, w.shape(), &[out as i32, inp as i32])?;
                Ok(Linear::Dense(if w.dtype() == dtype {
                    w
                } else {
                    w.astype(dtype)?
                }))
            }
            Tensor::Quantized(q) => {
                let packed_cols = inp as i32 * q.bits / 32;
                self.check_shape(name, q.packed.shape(), &[out as i32, packed_cols])?;
                let scales = q.scales.astype(dtype)?;
                let biases = q.biases.astype(dtype)?;
                Ok(Linear::Quantized(QuantizedArray {
                    scales,
                    biases,
                    ..q
                }))
            }
            Tensor::Gguf(g) => {
                self.check_shape(name, vec![g.rows()?, g.cols], &[out as i32, inp as i32])?;
                Ok(Linear::Gguf(g))
            }
        }
    }

    /// Projections stacked along the output axis (fused into one matmul).
    fn fused(
        &mut self,
        parts: &[(&str, usize)],
        inp: usize,
        dtype: Dtype,
    ) -> Result<Linear, WeightsError> {
        let linears = parts
            .iter()
            .map(|(name, out)| self.linear(name, *out, inp, dtype))
            .collect::<Result<Vec<_>, _>>()?;
        let dense: Vec<&Array> = linears
            .iter()
            .filter_map(|l| match l {
                Linear::Dense(w) => Some(w),
                _ => None,
            })
            .collect();
        if dense.len() == linears.len() {
            return Ok(Linear::Dense(concatenate(&dense, 0)?));
        }
        let blocks: Vec<&GgufMatrix> = linears
            .iter()
            .filter_map(|l| match l {
                Linear::Gguf(g) => Some(g),
                _ => None,
            })
            .collect();
        if !blocks.is_empty() {
            // One matrix where the blocks share a type, the parts one after
            // another otherwise (llama.cpp's mixes give some layers' values
            // another type than their queries and keys).
            return Ok(match blocks.first() {
                Some(f)
                    if blocks.len() == linears.len()
                        && blocks.iter().all(|g| g.dtype == f.dtype) =>
                {
                    let bytes: Vec<&Array> = blocks.iter().map(|g| &g.bytes).collect();
                    Linear::Gguf(GgufMatrix {
                        bytes: concatenate(&bytes, 0)?,
                        dtype: f.dtype,
                        cols: f.cols,
                        arithmetic: f.arithmetic,
                    })
                }
                _ => Linear::Parts(linears),
            });
        }
        let quantized: Vec<&QuantizedArray> = linears
            .iter()
            .filter_map(|l| match l {
                Linear::Quantized(q) => Some(q),
                _ => None,
            })
            .collect();
        let first = quantized.first().copied();
        let same = first.is_some_and(|f| {
            quantized
                .iter()
                .all(|q| q.bits == f.bits && q.group_size == f.group_size)
        });
        match (first, same && quantized.len() == linears.len()) {
            (Some(f), true) => {
                let cat = |pick: fn(&QuantizedArray) -> &Array| concatenate(&quantized.iter().map(|q| pick(q)).collect::<Vec<_>>(), 0);
                Ok(Linear::Quantized(QuantizedArray {
                    packed: cat(|q| &q.packed)?,
                    scales: cat(|q| &q.scales)?,
                    biases: cat(|q| &q.biases)?,
                    group_size: f.group_size,
                    bits: f.bits,
                }))
            }
            _ => Err(WeightsError::Invalid {
                file: self.file.clone(),
                message: format!(
                    "cannot fuse {:?}: they mix quantized and dense weights or quantization settings",
                    parts.iter().map(|p| p.0).collect::<Vec<_>>()
                ),
            }),
        }
    }

    /// Builds the model; every tensor of the map must be used by it.
    pub fn into_model(
        mut self,
        config: Gemma3Config,
        dtype: Dtype,
    ) -> Result<Gemma3, WeightsError> {
        let c = &config;
        let (hidden, inter, d) = (c.hidden_size, c.intermediate_size, c.head_dim);
        let (q_out, kv_out) = (c.num_attention_heads * d, c.num_key_value_heads * d);
        let embed = self.linear("model.embed_tokens.weight", c.vocab_size, hidden, dtype)?;
        let norm = self.norm("model.norm.weight", hidden, dtype)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            layers.push(Layer {
                input_norm: self.norm(&p("input_layernorm.weight"), hidden, dtype)?,
                qkv_proj: self.fused(
                    &[
                        (&p("self_attn.q_proj.weight"), q_out),
                        (&p("self_attn.k_proj.weight"), kv_out),
                        (&p("self_attn.v_proj.weight"), kv_out),
                    ],
                    hidden,
                    dtype,
                )?,
                o_proj: self.linear(&p("self_attn.o_proj.weight"), hidden, q_out, dtype)?,
                q_norm: self.norm(&p("self_attn.q_norm.weight"), d, dtype)?,
                k_norm: self.norm(&p("self_attn.k_norm.weight"), d, dtype)?,
                post_attention_norm: self.norm(
                    &p("post_attention_layernorm.weight"),
                    hidden,
                    dtype,
                )?,
                pre_feedforward_norm: self.norm(
                    &p("pre_feedforward_layernorm.weight"),
                    hidden,
                    dtype,
                )?,
                gate_up_proj: self.fused(
                    &[
                        (&p("mlp.gate_proj.weight"), inter),
                        (&p("mlp.up_proj.weight"), inter),
                    ],
                    hidden,
                    dtype,
                )?,
                down_proj: self.linear(&p("mlp.down_proj.weight"), hidden, inter, dtype)?,
                post_feedforward_norm: self.norm(
                    &p("post_feedforward_layernorm.weight"),
                    hidden,
                    dtype,
                )?,
            });
        }
        if self.tensors.contains_key("lm_head.weight") {
            return Err(WeightsError::Invalid {
                file: self.file.clone(),
                message: "has a separate output projection 'lm_head.weight'; Gemma 3 ties it to the embedding".into(),
            });
        }
        if let Some(extra) = self.tensors.keys().next() {
            return Err(WeightsError::Invalid {
                file: self.file.clone(),
                message: format!(
                    "tensor '{extra}' is not part of a {}-layer Gemma 3 text model",
                    c.num_hidden_layers
                ),
            });
        }
        Ok(Gemma3 {
            config,
            dtype,
            embed,
            layers,
            norm,
            gpu_kernels: false,
        })
    }
}
