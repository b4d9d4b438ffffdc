//! A tiny random model fed the same 40 tokens two ways: the eager forward
//! pass all at once, and an eager prefill, fixed-shape decode steps and an
//! eager chunk (the decode-step tests on the CPU and the fused kernels' on
//! the GPU).

use gemma::cache::{CacheFormat, LayerCache};
use gemma::forward::decode_step::DecodeStep;
use gemma::model::Gemma3;
use mlx_core::{concatenate, Array, Dtype};

use super::models::{random_model, tiny_config};

/// Tokens fed in all.
pub const TOKENS: usize = 40;
/// Tokens of the eager prefill.
pub const PREFILL: usize = 5;
/// Fixed-shape steps after it (an eager chunk takes the rest).
pub const FIXED: usize = 30;
/// The tiny model's vocabulary.
pub const VOCAB: i32 = 512;

/// Random float32 weights (the same for every window: they depend on the
/// shapes only).
pub fn tiny_model(window: usize) -> Gemma3 {
    tiny_model_with_heads(window, 64)
}

/// [`tiny_model`] with heads of `head_dim` values (128 for TurboQuant).
pub fn tiny_model_with_heads(window: usize, head_dim: usize) -> Gemma3 {
    let mut c = tiny_config(3);
    c.sliding_window = window;
    c.head_dim = head_dim;
    c.query_pre_attn_scalar = head_dim as f32;
    assert_eq!(c.vocab_size, VOCAB as usize);
    random_model(c, Dtype::Float32, 23)
}

/// The token ids fed.
pub fn token_ids() -> Vec<i32> {
    (0..TOKENS as i32).map(|i| (i * 53 + 7) % VOCAB).collect()
}

/// `ids` as a `[1, L]` array.
pub fn tokens(ids: &[i32]) -> Array {
    Array::from_slice(ids, &[1, ids.len() as i32]).expect("tokens")
}

/// `logits` once it and the caches are evaluated.
pub fn evaluated(logits: Array, caches: &[LayerCache]) -> Array {
    let mut arrays = vec![&logits];
    arrays.extend(caches.iter().flat_map(LayerCache::arrays));
    mlx_core::eval(&arrays).expect("eval");
    logits
}

/// The parts' logits, concatenated along the sequence, as float32.
pub fn flat(parts: &[Array]) -> Vec<f32> {
    let parts: Vec<&Array> = parts.iter().collect();
    concatenate(&parts, 1)
        .expect("concatenate")
        .astype(Dtype::Float32)
        .expect("float32")
        .to_vec::<f32>()
        .expect("logits")
}

/// Logits of the whole sequence in one eager forward.
pub fn eager(model: &Gemma3) -> Vec<f32> {
    let mut caches = model.make_caches(CacheFormat::COMPUTE).expect("caches");
    let out = model
        .forward(&tokens(&token_ids()), &mut caches)
        .expect("forward");
    flat(&[evaluated(out, &caches)])
}

/// How the single tokens between the prefill and the last chunk are fed.
#[derive(Debug, Clone, Copy)]
pub enum Steps {
    /// Through the eager forward pass, one token each.
    Eager,
    /// Through fixed-shape decode steps, compiled or not.
    Fixed {
        /// Whether MLX compiles the step.
        compiled: bool,
    },
}

/// Logits of an eager prefill, fixed-shape steps, then an eager chunk.
pub fn mixed(model: &Gemma3, compiled: bool) -> (Vec<f32>, Vec<LayerCache>) {
    scheduled(model, CacheFormat::COMPUTE, 0, Steps::Fixed { compiled })
}

/// Logits of an eager prefill, single-token steps fed as `steps` says, then
/// an eager chunk, over caches storing `format` from token `start` on.
pub fn scheduled(
    model: &Gemma3,
    format: CacheFormat,
    start: i32,
    steps: Steps,
) -> (Vec<f32>, Vec<LayerCache>) {
    let ids = token_ids();
    let mut caches: Vec<LayerCache> = model
        .make_caches(format)
        .expect("caches")
        .into_iter()
        .map(|c| c.quantize_from(start))
        .collect();
    let mut parts = Vec::new();
    let out = model
        .forward(&tokens(&ids[..PREFILL]), &mut caches)
        .expect("prefill");
    parts.push(evaluated(out, &caches));
    let end = (PREFILL + FIXED) as i32;
    let step = match steps {
        Steps::Eager => None,
        Steps::Fixed { compiled } => {
            let step = DecodeStep::new(model, compiled).expect("decode step");
            assert!(step.reserve(&mut caches, end).expect("reserve"));
            Some(step)
        }
    };
    for &id in &ids[PREFILL..PREFILL + FIXED] {
        let out = match &step {
            Some(step) => step.forward(&tokens(&[id]), &mut caches),
            None => model.forward(&tokens(&[id]), &mut caches),
        }
        .expect("single-token step");
        parts.push(evaluated(out, &caches));
    }
    assert!(caches.iter().all(|c| c.offset() == end));
    let out = model
        .forward(&tokens(&ids[PREFILL + FIXED..]), &mut caches)
        .expect("eager chunk");
    parts.push(evaluated(out, &caches));
    (flat(&parts), caches)
}

/// Largest |a − b|.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
