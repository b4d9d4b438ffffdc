//! The models the parity tests compare on: a tiny random Gemma 3 and the
//! default 270M model, each with a Hugging Face folder mlx-lm can load.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Instant, UNIX_EPOCH};

use gemma::config::Gemma3Config;
use gemma::convert::write_hf_folder;
use gemma::gguf::GgufFile;
use gemma::load::{load, LoadOptions, ModelSource, WeightStorage};
use gemma::model::Gemma3;
use gemma::tokenizer::Tokenizer;
use gemma::weights::{load_gguf_tensors, random_tensors, Tensor};
use mlx_core::{random, Array, Dtype};
use tempfile::TempDir;

use super::{serial, workspace_root};

/// A tiny Gemma 3 (the 270M configuration cut down): 4 layers, hidden 64,
/// 4 query heads of 64 over 2 key/value heads, MLP 128, vocabulary 512, a
/// 24-token sliding window, linear RoPE scaling 8 on global layers, and every
/// `sliding_window_pattern`-th layer global (1: all global).
pub fn tiny_config(sliding_window_pattern: usize) -> Gemma3Config {
    let mut c = Gemma3Config::published("270m", Some(4)).expect("published 270m config");
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.query_pre_attn_scalar = 64.0;
    c.sliding_window = 24;
    c.sliding_window_pattern = sliding_window_pattern;
    c.rope_scaling = Some(8.0);
    c
}

/// Random weights of `config` in `dtype` from `seed`, through the loader.
pub fn random_model(config: Gemma3Config, dtype: Dtype, seed: u64) -> Gemma3 {
    let options = LoadOptions {
        dtype,
        quantize: None,
        weights: WeightStorage::Dequantized,
    };
    random_model_with(config, options, seed)
}

/// Random weights of `config` from `seed`, loaded with `options`.
pub fn random_model_with(config: Gemma3Config, options: LoadOptions, seed: u64) -> Gemma3 {
    let source = ModelSource::Random {
        config: Box::new(config),
        seed,
    };
    load(&source, options, &mut |_, _| {})
        .expect("random model")
        .model
}

/// How much the tiny model's final norm gain is scaled.
const GAIN: f64 = 25.0;

/// A model and the Hugging Face folder holding the same weights.
pub struct TinyModel {
    /// Our model.
    pub model: Gemma3,
    /// The folder for mlx-lm (deleted on drop).
    pub dir: TempDir,
}

/// Random float32 weights for `config` from `seed`, with the final norm's
/// gain `1 + w` scaled by 25 so that logits spread over ±20 (with the
/// loader's 0.02-deviation embedding they would all be within ±1 and tell
/// little apart). A larger embedding would do the same but would swamp the
/// residual stream, and greedy decoding would only repeat the last token.
pub fn tiny_model(config: &Gemma3Config, seed: u64) -> TinyModel {
    let mut tensors = random_tensors(config, Dtype::Float32, seed).expect("random weights");
    let name = "model.norm.weight";
    let Some(Tensor::Dense(w)) = tensors.tensors.get(name) else {
        panic!("random weights have no dense {name}");
    };
    let one = Array::scalar(1.0, Dtype::Float32).expect("scalar");
    let gain = Array::scalar(GAIN, Dtype::Float32).expect("scalar");
    let scaled = w
        .add(&one)
        .and_then(|g| g.multiply(&gain))
        .and_then(|g| g.subtract(&one))
        .expect("scale the final norm");
    scaled.eval().expect("eval");
    tensors.tensors.insert(name.into(), Tensor::Dense(scaled));
    let dir = tempfile::tempdir().expect("temporary directory");
    write_hf_folder(&tensors, config, None, dir.path()).expect("write the HF folder");
    let model = tensors
        .into_model(config.clone(), Dtype::Float32)
        .expect("build the model");
    TinyModel { model, dir }
}

/// `n` token ids uniform over `0..vocab`, reproducible from `seed`.
pub fn random_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let key = random::key(seed).expect("key");
    let ids = random::uniform(0.0, vocab as f32, &[n as i32], Dtype::Float32, Some(&key))
        .and_then(|u| u.floor())
        .and_then(|u| u.astype(Dtype::Int32))
        .and_then(|u| u.to_vec::<i32>())
        .expect("random ids");
    ids.into_iter()
        .map(|t| u32::try_from(t.clamp(0, vocab as i32 - 1)).expect("non-negative"))
        .collect()
}

/// The default model's GGUF file: `GEMMA_MLX_MODEL`, or
/// `<workspace>/target/model/gemma-3-270m-q4_k_m.gguf`.
pub fn default_model_path() -> PathBuf {
    std::env::var_os("GEMMA_MLX_MODEL").map_or_else(
        || workspace_root().join("target/model/gemma-3-270m-q4_k_m.gguf"),
        PathBuf::from,
    )
}

/// The default model, in float32.
pub struct DefaultModel {
    /// Our model.
    pub model: Gemma3,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// The same weights as a Hugging Face folder, when asked for.
    pub hf_dir: Option<PathBuf>,
}

/// Loads the default model (panicking, with what to do, when the file is
/// missing); with `convert`, also provides it as a Hugging Face folder (see
/// [`converted_dir`]).
pub fn load_default(convert: bool) -> DefaultModel {
    let path = default_model_path();
    assert!(
        path.exists(),
        "the default model {} is missing: run `cargo xtask setup` (or set GEMMA_MLX_MODEL)",
        path.display()
    );
    let started = Instant::now();
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let config = Gemma3Config::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"));
    let tokenizer = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"));
    let tensors = load_gguf_tensors(&file, Dtype::Float32, None, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("{e}"));
    let hf_dir = convert.then(|| {
        let (dir, stamp) = converted_dir(&path);
        if std::fs::read_to_string(dir.join(STAMP)).ok().as_deref() != Some(stamp.as_str()) {
            let partial = dir.with_extension("partial");
            let _ = std::fs::remove_dir_all(&partial);
            let _ = std::fs::remove_dir_all(&dir);
            write_hf_folder(&tensors, &config, Some(&tokenizer), &partial)
                .unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(partial.join(STAMP), &stamp).expect("write the stamp");
            std::fs::rename(&partial, &dir).expect("rename the converted folder");
            println!("converted {} into {}", path.display(), dir.display());
        }
        dir
    });
    let model = tensors
        .into_model(config, Dtype::Float32)
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "loaded {} in {:.1} s",
        path.display(),
        started.elapsed().as_secs_f64()
    );
    DefaultModel {
        model,
        tokenizer,
        hf_dir,
    }
}

static DEFAULT: Mutex<Option<DefaultModel>> = Mutex::new(None);

/// Runs `f` on the default model, loaded (and, with `convert`, converted)
/// once per test binary, holding [`serial`] meanwhile.
pub fn with_default_model<R>(convert: bool, f: impl FnOnce(&DefaultModel) -> R) -> R {
    let _mlx = serial();
    let mut slot = DEFAULT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if slot.as_ref().is_none_or(|m| convert && m.hf_dir.is_none()) {
        *slot = Some(load_default(convert));
    }
    f(slot.as_ref().expect("loaded just above"))
}

const STAMP: &str = "stamp.txt";

/// Where the converted default model is kept between runs
/// (`<workspace>/target/parity/default-model`), and the stamp that says what
/// it was made from: the GGUF file's path, size and modification time and
/// the modification time of this test binary, so that a rebuilt crate (a
/// changed converter) converts again.
fn converted_dir(gguf: &Path) -> (PathBuf, String) {
    let mtime = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos())
    };
    let size = std::fs::metadata(gguf).map_or(0, |m| m.len());
    let exe = std::env::current_exe().unwrap_or_default();
    let stamp = format!(
        "{}\n{size}\n{}\n{}\n",
        gguf.display(),
        mtime(gguf),
        mtime(&exe)
    );
    (workspace_root().join("target/parity/default-model"), stamp)
}

/// The English prose of `tests/fixtures/text/` (every `.txt` file, by name,
/// separated by blank lines).
pub fn corpus_text() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/text");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect::<Vec<_>>()
        .join("\n\n")
}
