//! Random numbers: reproducibility from keys and sample statistics.
//!
//! Statistical bounds are 4 standard errors: a correct generator fails one of
//! them with probability about 6·10⁻⁵, and with fixed keys the outcome is
//! deterministic anyway.

mod common;

use common::read_f32;
use mlx_core::{random, Array, Dtype};

const N: usize = 100_000;

#[test]
fn the_same_key_gives_the_same_numbers() {
    let a = random::uniform(
        0.0,
        1.0,
        &[16],
        Dtype::Float32,
        Some(&random::key(42).unwrap()),
    )
    .unwrap();
    let b = random::uniform(
        0.0,
        1.0,
        &[16],
        Dtype::Float32,
        Some(&random::key(42).unwrap()),
    )
    .unwrap();
    assert_eq!(read_f32(&a), read_f32(&b));
    let n1 = random::normal(
        &[16],
        Dtype::Float32,
        0.0,
        1.0,
        Some(&random::key(42).unwrap()),
    )
    .unwrap();
    let n2 = random::normal(
        &[16],
        Dtype::Float32,
        0.0,
        1.0,
        Some(&random::key(42).unwrap()),
    )
    .unwrap();
    assert_eq!(read_f32(&n1), read_f32(&n2));
}

#[test]
fn different_seeds_and_split_keys_give_different_numbers() {
    let draw = |key: &Array| {
        read_f32(&random::uniform(0.0, 1.0, &[16], Dtype::Float32, Some(key)).unwrap())
    };
    let key = random::key(42).unwrap();
    let (k1, k2) = random::split(&key).unwrap();
    assert_eq!(k1.shape(), key.shape());
    let (parent, first, second) = (draw(&key), draw(&k1), draw(&k2));
    assert_ne!(first, second);
    assert_ne!(first, parent);
    assert_ne!(second, parent);
    assert_ne!(draw(&random::key(43).unwrap()), parent);
    // Splitting is deterministic too.
    let (again, _) = random::split(&key).unwrap();
    assert_eq!(draw(&again), first);
}

#[test]
fn uniform_stays_within_bounds() {
    let key = random::key(1).unwrap();
    let x = read_f32(&random::uniform(-2.0, 5.0, &[10_000], Dtype::Float32, Some(&key)).unwrap());
    assert!(x.iter().all(|&v| (-2.0..5.0).contains(&v)));
    // The samples spread over the range.
    assert!(x.iter().any(|&v| v < -1.9) && x.iter().any(|&v| v > 4.9));
}

#[test]
fn uniform_mean_is_one_half_within_four_standard_errors() {
    // Var U(0, 1) = 1/12, so the standard error of the mean is √(1/(12 N)).
    let key = random::key(2).unwrap();
    let x = random::uniform(0.0, 1.0, &[N as i32], Dtype::Float32, Some(&key)).unwrap();
    let mean = x.mean_all().unwrap().item::<f32>().unwrap();
    let bound = 4.0 * (1.0 / (12.0 * N as f32)).sqrt();
    assert!((mean - 0.5).abs() <= bound, "mean {mean}, bound {bound}");
}

#[test]
fn normal_mean_and_standard_deviation_within_four_standard_errors() {
    // Mean: standard error σ/√N. Standard deviation: about σ/√(2N).
    let (loc, scale) = (1.0f64, 2.0f64);
    let key = random::key(3).unwrap();
    let x = read_f32(
        &random::normal(
            &[N as i32],
            Dtype::Float32,
            loc as f32,
            scale as f32,
            Some(&key),
        )
        .unwrap(),
    );
    let n = N as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = x
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / (n - 1.0);
    let std = var.sqrt();
    assert!((mean - loc).abs() <= 4.0 * scale / n.sqrt(), "mean {mean}");
    assert!(
        (std - scale).abs() <= 4.0 * scale / (2.0 * n).sqrt(),
        "std {std}"
    );
}

#[test]
fn the_global_generator_works_without_a_key() {
    let x = read_f32(&random::uniform(3.0, 4.0, &[100], Dtype::Float32, None).unwrap());
    assert!(x.iter().all(|&v| (3.0..4.0).contains(&v)));
    let y = random::normal(&[10], Dtype::Float32, 0.0, 1.0, None).unwrap();
    assert_eq!(y.shape(), vec![10]);
}

#[test]
fn uniform_and_normal_in_bfloat16() {
    let key = random::key(4).unwrap();
    let u = random::uniform(0.0, 1.0, &[64], Dtype::Bfloat16, Some(&key)).unwrap();
    assert_eq!(u.dtype(), Dtype::Bfloat16);
    assert!(u
        .to_vec::<half::bf16>()
        .unwrap()
        .iter()
        .all(|v| (0.0..=1.0).contains(&v.to_f32())));
    let n = random::normal(&[64], Dtype::Bfloat16, 0.0, 1.0, Some(&key)).unwrap();
    assert_eq!(n.dtype(), Dtype::Bfloat16);
}

#[test]
fn categorical_frequencies_match_the_probabilities_within_four_standard_errors() {
    // Each count of category i is Binomial(N, pᵢ): standard error of the
    // frequency √(pᵢ (1 − pᵢ) / N), i.e. 0.00126, 0.00145, 0.00158.
    let p = [0.2f32, 0.3, 0.5];
    let logits: Vec<f32> = p.iter().map(|v| v.ln()).collect();
    let rows = Array::from_slice(&logits, &[1, 3])
        .unwrap()
        .broadcast_to(&[N as i32, 3])
        .unwrap();
    let key = random::key(5).unwrap();
    let draws = random::categorical(&rows, -1, Some(&key)).unwrap();
    assert_eq!(draws.shape(), vec![N as i32]);
    assert_eq!(draws.dtype(), Dtype::Uint32);
    let mut counts = [0usize; 3];
    for d in draws.to_vec::<u32>().unwrap() {
        counts[d as usize] += 1;
    }
    for (i, &pi) in p.iter().enumerate() {
        let freq = counts[i] as f32 / N as f32;
        let bound = 4.0 * (pi * (1.0 - pi) / N as f32).sqrt();
        assert!(
            (freq - pi).abs() <= bound,
            "category {i}: frequency {freq}, p {pi}, bound {bound}"
        );
    }
}

#[test]
fn categorical_never_draws_a_category_of_minus_infinity() {
    let logits = Array::from_slice(
        &[0.0f32, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY],
        &[1, 4],
    )
    .unwrap()
    .broadcast_to(&[1000, 4])
    .unwrap();
    let key = random::key(6).unwrap();
    let draws = random::categorical(&logits, 1, Some(&key))
        .unwrap()
        .to_vec::<u32>()
        .unwrap();
    assert!(draws.iter().all(|&d| d == 0 || d == 2));
    assert!(draws.contains(&0) && draws.contains(&2));
}
