//! Loading a model from the files people have: a GGUF file, a Hugging Face
//! or MLX checkpoint folder, or random weights of a published size.

use std::path::{Path, PathBuf};

use mlx_core::device::default_device;
use mlx_core::{quantize, Device, Dtype};

use crate::chat_template::{ChatTemplate, ChatTemplateError, GEMMA3_BOS_TOKEN};
use crate::config::{ConfigError, Gemma3Config};
use crate::gguf::{GgufError, GgufFile};
use crate::linear::affine;
use crate::linear::Linear;
use crate::model::Gemma3;
pub use crate::quant::{Activations, Arithmetic};
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::weights::{
    load_gguf_tensors, load_safetensors_tensors, random_tensors, TensorMap, WeightsError,
};
pub use mlx_core::block_dot::CpuKernels;

/// Where a model's weights come from.
#[derive(Debug, Clone)]
pub enum ModelSource {
    /// A `.gguf` file.
    Gguf(PathBuf),
    /// A folder with `config.json` and safetensors weights (Hugging Face or MLX).
    Folder(PathBuf),
    /// Random weights of a configuration, from a seed.
    Random {
        /// The shape.
        config: Box<Gemma3Config>,
        /// The seed.
        seed: u64,
    },
}

impl ModelSource {
    /// A GGUF file or a checkpoint folder, told apart by what `path` is.
    pub fn from_path(path: &Path) -> ModelSource {
        if path.is_dir() {
            ModelSource::Folder(path.to_path_buf())
        } else {
            ModelSource::Gguf(path.to_path_buf())
        }
    }
}

/// How to load.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// The compute dtype of weights and activations.
    pub dtype: Dtype,
    /// Quantize dense weights after loading: `(bits, group_size)`, MLX affine.
    pub quantize: Option<(i32, i32)>,
    /// How a GGUF file's block-quantized weights are held.
    pub weights: WeightStorage,
}

/// How a GGUF file's block-quantized projection weights are held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WeightStorage {
    /// Dequantized to the compute dtype at load.
    #[default]
    Dequantized,
    /// As stored, multiplied by our CPU kernels over the blocks
    /// ([`crate::linear::GgufMatrix`]) as the arithmetic given says
    /// (how activations enter, which kernel family); needs the CPU and
    /// float32. With 8-bit activations on the CPU, MLX affine-quantized
    /// weights (a quantized checkpoint, or `quantize`) also take our kernel
    /// of that family where it has one ([`Linear::QuantizedCpu`]).
    Native(Arithmetic),
}

impl WeightStorage {
    /// The name `gemma-mlx` gives it: `native` or `dequantized`.
    pub fn name(self) -> &'static str {
        match self {
            WeightStorage::Dequantized => "dequantized",
            WeightStorage::Native(_) => "native",
        }
    }
}

/// A failure to load a model; the message names the file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The GGUF file is unreadable or malformed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The configuration is missing or malformed.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The weights do not make a model.
    #[error(transparent)]
    Weights(#[from] WeightsError),
    /// The tokenizer cannot be built.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The chat template cannot be read.
    #[error(transparent)]
    ChatTemplate(#[from] ChatTemplateError),
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// The file or folder does not exist or cannot be used.
    #[error("{}: {message}", path.display())]
    Path {
        /// The path.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// A model with what goes with it.
#[derive(Debug)]
pub struct LoadedModel {
    /// The model.
    pub model: Gemma3,
    /// Its tokenizer (random weights have none).
    pub tokenizer: Option<Tokenizer>,
    /// Its chat template (the built-in Gemma 3 format when it has none).
    pub chat_template: ChatTemplate,
    /// A short name: the file or folder name, or `random-<size>`.
    pub name: String,
    /// Weight quantization in effect, `(bits, group_size)`, if any.
    pub weight_quantization: Option<(i32, i32)>,
    /// How the weights are held, and for native ones how their products
    /// compute.
    pub weights: WeightStorage,
}

/// A checkpoint's parts before they become a model.
#[derive(Debug)]
pub struct Checkpoint {
    /// The hyperparameters.
    pub config: Gemma3Config,
    /// The tensors by Hugging Face name.
    pub tensors: TensorMap,
    /// The tokenizer, if the checkpoint has one.
    pub tokenizer: Option<Tokenizer>,
    /// The chat template.
    pub chat_template: ChatTemplate,
    /// A short name.
    pub name: String,
}

/// Reads a checkpoint's configuration, tokenizer and tensors (in `dtype`,
/// a GGUF file's block-quantized weights held as `weights` says).
/// `progress(done, total)` reports tensors read.
pub fn read_checkpoint(
    source: &ModelSource,
    dtype: Dtype,
    weights: WeightStorage,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Checkpoint, LoadError> {
    read_checkpoint_with(source, dtype, weights, TokenizerBuild::Now, progress)
}

/// When a GGUF file's tokenizer builds its encoder.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TokenizerBuild {
    /// Before the weights load ([`Tokenizer::from_gguf`]), so that what its
    /// construction frees is reused by the weights.
    #[default]
    Now,
    /// When a text is first encoded ([`Tokenizer::from_gguf_deferred`]): the
    /// load holds the pieces only (3 MB, not the encoder's 72 MB for Gemma
    /// 3's vocabulary), for runs whose prompts are ids.
    WhenEncoding,
}

/// [`read_checkpoint`], building a GGUF file's tokenizer as `tokenizer_build` says.
fn read_checkpoint_with(
    source: &ModelSource,
    dtype: Dtype,
    weights: WeightStorage,
    tokenizer_build: TokenizerBuild,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Checkpoint, LoadError> {
    Ok(match source {
        ModelSource::Gguf(path) => {
            check_exists(path)?;
            let file = GgufFile::open(path)?;
            let config = Gemma3Config::from_gguf(&file)?;
            let tokenizer = match tokenizer_build {
                TokenizerBuild::Now => Tokenizer::from_gguf(&file)?,
                TokenizerBuild::WhenEncoding => Tokenizer::from_gguf_deferred(&file)?,
            };
            check_vocab(path, &config, &tokenizer)?;
            let chat_template = ChatTemplate::from_gguf(&file)?;
            let native = match weights {
                WeightStorage::Native(arithmetic) => Some(arithmetic),
                WeightStorage::Dequantized => None,
            };
            let tensors = load_gguf_tensors(&file, dtype, native, progress)?;
            Checkpoint {
                config,
                tensors,
                tokenizer: Some(tokenizer),
                chat_template,
                name: file_name(path),
            }
        }
        ModelSource::Folder(path) => {
            check_exists(path)?;
            let config = Gemma3Config::from_json_file(&path.join("config.json"))?;
            let tokenizer_path = path.join("tokenizer.json");
            let tokenizer = if tokenizer_path.is_file() {
                Some(Tokenizer::from_file(&tokenizer_path)?)
            } else {
                None
            };
            if let Some(t) = &tokenizer {
                check_vocab(&tokenizer_path, &config, t)?;
            }
            let tokenizer_config = path.join("tokenizer_config.json");
            let chat_template = if tokenizer_config.is_file() {
                ChatTemplate::from_tokenizer_config(&tokenizer_config)?
            } else {
                ChatTemplate::from_source(None, GEMMA3_BOS_TOKEN)?
            };
            let tensors =
                load_safetensors_tensors(path, dtype, config.quantization.as_ref(), progress)?;
            Checkpoint {
                config,
                tensors,
                tokenizer,
                chat_template,
                name: file_name(path),
            }
        }
        ModelSource::Random { config, seed } => {
            let tensors = random_tensors(config, dtype, *seed)?;
            let name = format!(
                "random-{}-layers-{}",
                config.hidden_size, config.num_hidden_layers
            );
            Checkpoint {
                config: (**config).clone(),
                tensors,
                tokenizer: None,
                chat_template: ChatTemplate::from_source(None, GEMMA3_BOS_TOKEN)?,
                name,
            }
        }
    })
}

/// Reads a model. `progress(done, total)` reports tensors read. Native
/// weights whose kernel family this CPU does not run are an error.
pub fn load(
    source: &ModelSource,
    options: LoadOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<LoadedModel, LoadError> {
    load_with(source, options, TokenizerBuild::Now, progress)
}

/// [`load`], building a GGUF file's tokenizer as `tokenizer_build` says.
pub fn load_with(
    source: &ModelSource,
    options: LoadOptions,
    tokenizer_build: TokenizerBuild,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<LoadedModel, LoadError> {
    let Checkpoint {
        config,
        tensors,
        tokenizer,
        chat_template,
        name,
    } = {
        if let WeightStorage::Native(arithmetic) = options.weights {
            arithmetic.kernels.require()?;
        }
        read_checkpoint_with(
            source,
            options.dtype,
            options.weights,
            tokenizer_build,
            progress,
        )?
    };
    let checkpoint_quantization = config
        .quantization
        .as_ref()
        .map(|q| (q.bits as i32, q.group_size as i32));
    let mut model = tensors.into_model(config, options.dtype)?;
    evaluate_weights(&model)?;
    if let Some((bits, group_size)) = options.quantize {
        quantize_weights(&mut model, bits, group_size)?;
    }
    if let WeightStorage::Native(arithmetic) = options.weights {
        if arithmetic.activations == Activations::Int8 && default_device()? == Device::Cpu {
            affine_products_on_our_kernel(&mut model, arithmetic.kernels)?;
        }
    }
    Ok(LoadedModel {
        model,
        tokenizer,
        chat_template,
        name,
        weight_quantization: options.quantize.or(checkpoint_quantization),
        weights: options.weights,
    })
}

/// Makes every weight now, a layer at a time (so that only one layer's
/// parts are held twice), instead of leaving some to their first use: the
/// fused projections (Q/K/V and gate/up) are concatenations of the
/// checkpoint's tensors and the norms' weights are 1 + w. A compiled
/// decode step traced before that use would replay them at every step: the
/// last layer's gate/up and norms, which no cache of the prompt needs, cost
/// two 118 µs copies and four additions a token at 27B on the H200.
fn evaluate_weights(model: &Gemma3) -> mlx_core::Result<()> {
    for layer in &model.layers {
        mlx_core::eval(&layer.arrays())?;
    }
    let mut rest = model.embed.arrays();
    rest.push(&model.norm);
    mlx_core::eval(&rest)
}

/// Replaces every dense projection (and the embedding) by its MLX affine
/// quantization.
pub fn quantize_weights(model: &mut Gemma3, bits: i32, group_size: i32) -> Result<(), LoadError> {
    each_projection(model, |l| {
        if let Linear::Dense(w) = l {
            let q = quantize(w, group_size, bits)?;
            mlx_core::eval(&[&q.packed, &q.scales, &q.biases])?;
            *l = Linear::Quantized(q);
        }
        Ok(())
    })
}

/// Hands every MLX affine-quantized projection (and embedding) our kernel
/// of `kernels` can take to it ([`Linear::QuantizedCpu`]); `load` does so
/// for 8-bit activations on the CPU.
pub fn affine_products_on_our_kernel(
    model: &mut Gemma3,
    kernels: CpuKernels,
) -> Result<(), LoadError> {
    each_projection(model, |l| {
        if let Linear::Quantized(q) = l {
            if affine::takes(q, kernels)? {
                *l = Linear::QuantizedCpu(q.clone(), kernels);
            }
        }
        Ok(())
    })
}

/// Runs `f` on the embedding and on every layer's projections.
fn each_projection(
    model: &mut Gemma3,
    mut f: impl FnMut(&mut Linear) -> mlx_core::Result<()>,
) -> Result<(), LoadError> {
    f(&mut model.embed)?;
    for layer in &mut model.layers {
        for l in [
            &mut layer.qkv_proj,
            &mut layer.o_proj,
            &mut layer.gate_up_proj,
            &mut layer.down_proj,
        ] {
            f(l)?;
        }
    }
    Ok(())
}

fn check_exists(path: &Path) -> Result<(), LoadError> {
    if path.exists() {
        Ok(())
    } else {
        Err(LoadError::Path {
            path: path.to_path_buf(),
            message: "no such file or folder".into(),
        })
    }
}

fn check_vocab(path: &Path, config: &Gemma3Config, tokenizer: &Tokenizer) -> Result<(), LoadError> {
    if tokenizer.vocab_size() > config.vocab_size {
        return Err(LoadError::Path {
            path: path.to_path_buf(),
            message: format!(
                "the tokenizer has {} tokens but the model's embedding has only {} rows",
                tokenizer.vocab_size(),
                config.vocab_size
            ),
        });
    }
    Ok(())
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
