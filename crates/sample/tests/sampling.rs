//! Draws from known distributions, greedy decoding and reproducibility.
//!
//! Statistical bound: a token of probability `p` appears `c ~ Binomial(N, p)`
//! times in `N` draws; we require `|c - N p| <= 4.5 σ` with
//! `σ = sqrt(N p (1 - p))`. For a correct sampler the normal approximation
//! puts the chance of one token failing at about 7e-6, so all the checks in
//! this file together fail by chance with probability below 1e-4; a wrong
//! distribution (each case below differs from the plausible wrong ones by
//! more than 20 σ) fails them surely. The seeds are fixed, so the outcome is
//! also deterministic. Tokens that must be filtered out must appear 0 times.

mod common;

use common::row;
use mlx_core::{Array, Dtype};
use sample::{Sampler, SamplerConfig};

const DRAWS: usize = 10_000;

/// How many times each token comes out of `DRAWS` draws.
fn counts(config: SamplerConfig, logits: &Array) -> Vec<usize> {
    counts_of(DRAWS, config, logits)
}

/// How many times each token comes out of `draws` draws.
fn counts_of(draws: usize, config: SamplerConfig, logits: &Array) -> Vec<usize> {
    let mut sampler = Sampler::new(config).unwrap();
    let mut counts = vec![0; logits.dim(-1).unwrap() as usize];
    for _ in 0..draws {
        let token = sampler.sample(logits, None).unwrap().item::<u32>().unwrap();
        counts[token as usize] += 1;
    }
    counts
}

/// Checks `counts` against the probabilities `expected` (see the module doc).
fn assert_matches(counts: &[usize], expected: &[f64]) {
    assert_eq!(counts.len(), expected.len());
    let n = counts.iter().sum::<usize>() as f64;
    for (token, (&c, &p)) in counts.iter().zip(expected).enumerate() {
        if p == 0.0 {
            assert_eq!(c, 0, "token {token} must never be drawn; counts {counts:?}");
            continue;
        }
        let sigma = (n * p * (1.0 - p)).sqrt();
        let deviation = (c as f64 - n * p).abs() / sigma;
        assert!(
            deviation <= 4.5,
            "token {token}: {c} draws, expected {:.0} (off by {deviation:.1} σ); counts {counts:?}",
            n * p
        );
    }
}

/// Probabilities proportional to `weights`.
fn normalized(weights: &[f64]) -> Vec<f64> {
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

fn log_row(probs: &[f32]) -> Array {
    row(&probs.iter().map(|p| p.ln()).collect::<Vec<_>>())
}

fn sampling(temperature: f32, seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature,
        seed,
        ..Default::default()
    }
}

#[test]
fn draws_follow_the_distribution() {
    let probs = [0.5, 0.25, 0.15, 0.1];
    let counts = counts(sampling(1.0, 1), &log_row(&probs));
    assert_matches(&counts, &[0.5, 0.25, 0.15, 0.1]);
}

#[test]
fn unnormalized_logits_are_normalized() {
    // Logits ln(w) + 7 for weights 2 : 1 : 1.
    let logits = row(&[2f32.ln() + 7.0, 7.0, 7.0]);
    assert_matches(&counts(sampling(1.0, 2), &logits), &[0.5, 0.25, 0.25]);
}

#[test]
fn temperature_half_squares_the_probabilities() {
    let probs = [0.5, 0.3, 0.2];
    let counts = counts(sampling(0.5, 3), &log_row(&probs));
    // p² renormalized: 0.25, 0.09, 0.04 over 0.38.
    assert_matches(&counts, &normalized(&[0.25, 0.09, 0.04]));
}

#[test]
fn filters_run_in_mlx_lm_order_on_the_untempered_distribution() {
    let probs = [0.35, 0.25, 0.2, 0.1, 0.06, 0.04];
    let config = SamplerConfig {
        top_p: Some(0.7),
        min_p: Some(0.3),
        top_k: Some(3),
        ..sampling(0.5, 4)
    };
    // top-p 0.7 first, on the untempered probabilities: ascending mass above
    // each token is 0.96, 0.9, 0.8, 0.6, 0.35, 0, so {0, 1, 2} remain.
    // min-p 0.3 (floor 0.105) and top-k 3 keep them. Temperature 0.5 then
    // squares: 0.1225 : 0.0625 : 0.04. (min-p before top-p would leave only
    // {0, 1}; tempering before top-p too.)
    let counts = counts(config, &log_row(&probs));
    assert_matches(&counts, &normalized(&[0.1225, 0.0625, 0.04, 0.0, 0.0, 0.0]));
}

#[test]
fn xtc_applies_with_its_probability() {
    // Above the 0.1 threshold: 0.5, 0.3, 0.15; XTC leaves 0.15 : 0.05.
    let probs = [0.5, 0.3, 0.15, 0.05];
    let xtc = |probability, seed| SamplerConfig {
        xtc_probability: Some(probability),
        xtc_threshold: 0.1,
        ..sampling(1.0, seed)
    };
    let always = counts(xtc(1.0, 7), &log_row(&probs));
    assert_matches(&always, &[0.0, 0.0, 0.75, 0.25]);
    // Half the time: the average of [0.5, 0.3, 0.15, 0.05] and [0, 0, 0.75, 0.25].
    let half = counts(xtc(0.5, 8), &log_row(&probs));
    assert_matches(&half, &[0.25, 0.15, 0.45, 0.15]);
    // A special token survives XTC.
    let kept = SamplerConfig {
        xtc_special_tokens: vec![0],
        ..xtc(1.0, 9)
    };
    assert_matches(
        &counts(kept, &log_row(&probs)),
        &normalized(&[0.5, 0.0, 0.15, 0.05]),
    );
}

#[test]
fn min_tokens_to_keep_applies_when_sampling() {
    let probs = [0.5, 0.2, 0.12, 0.09, 0.05, 0.04];
    let config = SamplerConfig {
        min_p: Some(0.2),
        min_tokens_to_keep: 4,
        ..sampling(1.0, 5)
    };
    // The floor 0.1 keeps three tokens; min_tokens_to_keep saves the fourth.
    let counts = counts(config, &log_row(&probs));
    assert_matches(&counts, &normalized(&[0.5, 0.2, 0.12, 0.09, 0.0, 0.0]));
}

#[test]
fn greedy_returns_the_argmax_whatever_the_seed() {
    let logits = row(&[0.1, 2.5, -1.0, 2.4]);
    for seed in [0, 1, 12345] {
        let mut sampler = Sampler::new(SamplerConfig {
            seed,
            ..Default::default()
        })
        .unwrap();
        assert!(sampler.is_greedy());
        for _ in 0..20 {
            let token = sampler.sample(&logits, None).unwrap();
            assert_eq!(token.shape(), vec![1]);
            assert_eq!(token.dtype(), Dtype::Uint32);
            assert_eq!(token.to_vec::<u32>().unwrap(), vec![1]);
        }
    }
}

#[test]
fn greedy_sees_the_processed_logits() {
    let config = SamplerConfig {
        logit_bias: vec![(3, 0.2)],
        ..Default::default()
    };
    let mut sampler = Sampler::new(config).unwrap();
    let logits = row(&[0.1, 2.5, -1.0, 2.4]).astype(Dtype::Bfloat16).unwrap();
    assert_eq!(
        sampler
            .sample(&logits, None)
            .unwrap()
            .item::<u32>()
            .unwrap(),
        3
    );
}

/// 100 draws from a uniform distribution over 8 tokens.
fn sequence(seed: u64) -> Vec<u32> {
    let mut sampler = Sampler::new(sampling(1.0, seed)).unwrap();
    assert!(!sampler.is_greedy());
    let logits = row(&[0.0; 8]);
    (0..100)
        .map(|_| {
            sampler
                .sample(&logits, None)
                .unwrap()
                .item::<u32>()
                .unwrap()
        })
        .collect()
}

#[test]
fn the_same_seed_gives_the_same_draws() {
    let first = sequence(7);
    assert_eq!(first, sequence(7));
    // Draws vary from call to call (the key is split each time).
    let mut distinct = first.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(
        distinct.len() > 4,
        "100 uniform draws over 8 tokens hit only {distinct:?}"
    );
}

#[test]
fn different_seeds_give_different_draws() {
    // Two independent sequences agree with probability 8^-100.
    assert_ne!(sequence(7), sequence(8));
}

#[test]
fn filters_work_on_a_gemma_sized_vocabulary() {
    // 262144 tokens at logit 0, and three at 10, 9.5 and 9. top-p 0.95 keeps
    // everything (the flat tokens tie with the threshold), top-k 2 the two
    // best, drawn in the ratio e^10 : e^9.5.
    let vocab = 262_144;
    let mut logits = vec![0.0f32; vocab];
    logits[7] = 10.0;
    logits[200_000] = 9.5;
    logits[123_456] = 9.0;
    let config = SamplerConfig {
        top_p: Some(0.95),
        top_k: Some(2),
        ..sampling(1.0, 6)
    };
    let counts = counts_of(300, config, &row(&logits));
    let mut expected = vec![0.0; vocab];
    expected[7] = 1.0 / (1.0 + (-0.5f64).exp());
    expected[200_000] = 1.0 - expected[7];
    assert_matches(&counts, &expected);
}
