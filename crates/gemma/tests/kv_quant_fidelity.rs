//! How much quantizing the KV cache changes the default model's next-token
//! distributions on real English text (`tests/fixtures/text/`): the mean
//! KL divergence KL(float ‖ quantized) over 4 chunks of 512 tokens (2,048
//! positions), each chunk run through fresh caches in one forward pass, in
//! float32.
//!
//! Needs the default model (`<workspace>/target/model/gemma-3-270m-q4_k_m.gguf`
//! or `GEMMA_MLX_MODEL`; `cargo xtask setup` fetches it); fails without it.

mod common;

use common::models::{corpus_text, with_default_model};
use common::ours::token_array;
use gemma::cache::{CacheFormat, KvFormat};
use gemma::model::Gemma3;
use mlx_core::Array;

/// Chunks of text, each `<bos>` and 511 corpus tokens.
const CHUNKS: usize = 4;
/// Tokens per chunk, `<bos>` included.
const CHUNK_LEN: usize = 512;
/// The mean KL divergence 8-bit keys and values (group 64) must stay under, in nats.
const MAX_8BIT_KLD: f64 = 0.02;

/// Both keys and values in `bits`-bit MLX affine quantization, groups of 64.
fn quantized(bits: i32) -> CacheFormat {
    let format = KvFormat::Quantized {
        bits,
        group_size: 64,
    };
    CacheFormat {
        keys: format,
        values: format,
        ..CacheFormat::COMPUTE
    }
}

/// Logits `[1, n, vocab]` of `ids` in one forward pass through fresh caches.
fn logits(model: &Gemma3, format: CacheFormat, ids: &[u32]) -> Array {
    let mut caches = model.make_caches(format).expect("caches");
    let logits = model
        .forward(&token_array(ids), &mut caches)
        .expect("forward pass");
    logits.eval().expect("evaluate");
    logits
}

/// log-softmax over the last axis.
fn log_probs(logits: &Array) -> Array {
    logits
        .logsumexp(&[-1], true)
        .and_then(|lse| logits.subtract(&lse))
        .expect("log-softmax")
}

/// What the float cache's logits `[1, n, vocab]` give, computed once per chunk.
struct FloatDistributions {
    log_p: Array,
    p: Array,
    top: Array,
}

impl FloatDistributions {
    fn new(logits: &Array) -> FloatDistributions {
        let log_p = log_probs(logits);
        let p = log_p.exp().expect("probabilities");
        let top = logits.argmax(-1, false).expect("argmax");
        mlx_core::eval(&[&log_p, &p, &top]).expect("evaluate");
        FloatDistributions { log_p, p, top }
    }
}

/// Summary of one quantized format against the float cache.
#[derive(Debug, Default)]
struct Fidelity {
    kl_sum: f64,
    kl_max: f32,
    same_top: usize,
    positions: usize,
}

impl Fidelity {
    /// Adds KL(float ‖ quantized) and top-token agreement at every position of
    /// the quantized cache's logits `[1, n, vocab]`.
    fn add(&mut self, float: &FloatDistributions, quantized: &Array) {
        let kl = float
            .log_p
            .subtract(&log_probs(quantized))
            .and_then(|d| d.multiply(&float.p))
            .and_then(|terms| terms.sum(&[-1], false))
            .and_then(|kl| kl.to_vec::<f32>())
            .expect("KL divergence");
        let same = quantized
            .argmax(-1, false)
            .and_then(|top| top.equal(&float.top))
            .and_then(|same| same.to_vec::<bool>())
            .expect("argmax");
        self.kl_sum += kl.iter().map(|&v| f64::from(v)).sum::<f64>();
        self.kl_max = kl.iter().copied().fold(self.kl_max, f32::max);
        self.same_top += same.iter().filter(|&&s| s).count();
        self.positions += kl.len();
    }

    fn mean(&self) -> f64 {
        self.kl_sum / self.positions as f64
    }
}

#[test]
fn eight_bit_kv_cache_keeps_next_token_distributions_on_real_text() {
    with_default_model(false, |model| {
        let corpus = model
            .tokenizer
            .encode_plain(&corpus_text())
            .expect("tokenize the corpus");
        let per_chunk = CHUNK_LEN - 1;
        assert!(
            corpus.len() >= CHUNKS * per_chunk,
            "the corpus has {} tokens, {} needed",
            corpus.len(),
            CHUNKS * per_chunk
        );
        let (mut eight, mut four) = (Fidelity::default(), Fidelity::default());
        for chunk in corpus.chunks_exact(per_chunk).take(CHUNKS) {
            let mut ids = vec![model.model.config.bos_token_id];
            ids.extend_from_slice(chunk);
            let float = FloatDistributions::new(&logits(&model.model, CacheFormat::COMPUTE, &ids));
            eight.add(&float, &logits(&model.model, quantized(8), &ids));
            four.add(&float, &logits(&model.model, quantized(4), &ids));
        }
        for (bits, f) in [(8, &eight), (4, &four)] {
            println!(
                "{bits}-bit keys and values (group 64) over {} positions: mean KLD {:.5} nats, \
                 max {:.4}, same top token at {:.2}%",
                f.positions,
                f.mean(),
                f.kl_max,
                100.0 * f.same_top as f64 / f.positions as f64
            );
        }
        assert_eq!(eight.positions, CHUNKS * CHUNK_LEN);
        assert!(
            eight.mean() < MAX_8BIT_KLD,
            "8-bit KV cache: mean KLD {} nats, over the limit {MAX_8BIT_KLD}",
            eight.mean()
        );
        assert!(
            four.mean() > eight.mean(),
            "4-bit KV cache: mean KLD {} nats, not above 8-bit's {}",
            four.mean(),
            eight.mean()
        );
    });
}
