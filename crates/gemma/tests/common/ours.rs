//! Crate `gemma`'s side of the comparisons: the same schedules as
//! `reference.py`, through [`Gemma3::forward`].

use gemma::cache::{CacheFormat, LayerCache};
use gemma::model::Gemma3;
use mlx_core::{Array, Dtype};

/// Token ids as the `[1, n]` int32 array the model takes.
pub fn token_array(ids: &[u32]) -> Array {
    let ids: Vec<i32> = ids
        .iter()
        .map(|&t| i32::try_from(t).expect("token id fits in i32"))
        .collect();
    Array::from_slice(&ids, &[1, ids.len() as i32]).expect("token array")
}

/// One forward call on `ids`; evaluates the logits together with the caches
/// (so the caches' lazy graphs do not grow from call to call) and returns
/// them as a row-major `[n, vocab]` host vector.
pub fn step(model: &Gemma3, caches: &mut [LayerCache], ids: &[u32]) -> Vec<f32> {
    let logits = model
        .forward(&token_array(ids), caches)
        .expect("forward pass");
    let logits = if logits.dtype() == Dtype::Float32 {
        logits
    } else {
        logits.astype(Dtype::Float32).expect("astype")
    };
    let mut arrays = vec![&logits];
    arrays.extend(caches.iter().flat_map(LayerCache::arrays));
    mlx_core::eval(&arrays).expect("evaluate");
    logits.to_vec::<f32>().expect("logits to host")
}

/// The logits of every position of every chunk, fed one call per chunk
/// through fresh caches of `format`: row-major `[positions, vocab]`.
pub fn logits(model: &Gemma3, format: CacheFormat, chunks: &[Vec<u32>]) -> Vec<f32> {
    let mut caches = model.make_caches(format).expect("caches");
    let mut out = Vec::new();
    for chunk in chunks {
        out.extend(step(model, &mut caches, chunk));
    }
    out
}

/// A greedy continuation.
#[derive(Debug, Clone)]
pub struct Greedy {
    /// The generated tokens.
    pub tokens: Vec<u32>,
    /// For each, how far its logit is above the runner-up's.
    pub margins: Vec<f32>,
}

/// `max_tokens` tokens after `prompt` (fed in one call), each the argmax of
/// the last logits, on fresh caches of `format`.
pub fn greedy(model: &Gemma3, format: CacheFormat, prompt: &[u32], max_tokens: usize) -> Greedy {
    let vocab = model.config.vocab_size;
    let mut caches = model.make_caches(format).expect("caches");
    let mut out = Greedy {
        tokens: Vec::new(),
        margins: Vec::new(),
    };
    let mut input = prompt.to_vec();
    for _ in 0..max_tokens {
        let logits = step(model, &mut caches, &input);
        let last = &logits[logits.len() - vocab..];
        let (token, margin) = top_with_margin(last);
        out.tokens.push(token);
        out.margins.push(margin);
        input = vec![token];
    }
    out
}

/// The index of the largest value (the first one on ties, like `argmax`)
/// and its lead over the second largest.
fn top_with_margin(row: &[f32]) -> (u32, f32) {
    let mut best = (0usize, f32::NEG_INFINITY);
    let mut second = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best.1 {
            second = best.1;
            best = (i, v);
        } else if v > second {
            second = v;
        }
    }
    (best.0 as u32, best.1 - second)
}
