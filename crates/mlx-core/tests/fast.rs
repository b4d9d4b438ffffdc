//! Fused kernels against formulas written out by hand or with plain ops.

mod common;

use common::{assert_array, assert_close, bools, f32s, read_f32};
use mlx_core::fast::{rms_norm, rope, scaled_dot_product_attention, AttentionMask, RopeOffset};
use mlx_core::{random, where_, Array, Dtype};

/// x / sqrt(mean(x²) + eps) · w, row by row, in f64.
fn rms_norm_by_hand(x: &[f32], w: Option<&[f32]>, eps: f64, dim: usize) -> Vec<f32> {
    x.chunks(dim)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / dim as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter()
                .enumerate()
                .map(move |(i, &v)| {
                    (f64::from(v) * inv * w.map_or(1.0, |w| f64::from(w[i]))) as f32
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn rms_norm_matches_the_formula_with_and_without_weight() {
    let x = [1.0f32, 2.0, 3.0, 4.0, -0.5, 0.25, 0.0, 8.0];
    let w = [1.0f32, 0.5, 2.0, -1.0];
    let eps = 1e-5;
    let with = rms_norm(&f32s(&x, &[2, 4]), Some(&f32s(&w, &[4])), eps).unwrap();
    assert_array(
        &with,
        &[2, 4],
        &rms_norm_by_hand(&x, Some(&w), f64::from(eps), 4),
        1e-5,
    );
    let without = rms_norm(&f32s(&x, &[2, 4]), None, eps).unwrap();
    assert_array(
        &without,
        &[2, 4],
        &rms_norm_by_hand(&x, None, f64::from(eps), 4),
        1e-5,
    );
    // First row by hand: mean(x²) = 30/4 = 7.5.
    let first = read_f32(&without)[0];
    assert!((f64::from(first) - 1.0 / (7.5f64 + 1e-5).sqrt()).abs() < 1e-6);
}

#[test]
fn rms_norm_eps_matters_for_tiny_inputs() {
    // mean(x²) = 1e-8, eps = 1e-2: x / sqrt(0.01000001) ≈ 10 · x
    let x = [1e-4f32, -1e-4];
    let out = rms_norm(&f32s(&x, &[1, 2]), None, 1e-2).unwrap();
    assert_close(&read_f32(&out), &rms_norm_by_hand(&x, None, 1e-2, 2), 1e-5);
}

/// Non-traditional (half-split) rotary embedding of one position vector:
/// pairs (i, i + dims/2) rotated by pos · base^(−2i/dims).
fn rope_by_hand(x: &[f32], dims: usize, base: f64, pos: f64) -> Vec<f32> {
    let half = dims / 2;
    let mut out: Vec<f32> = x.to_vec();
    for i in 0..half {
        let theta = pos * base.powf(-2.0 * i as f64 / dims as f64);
        let (s, c) = theta.sin_cos();
        let (a, b) = (f64::from(x[i]), f64::from(x[i + half]));
        out[i] = (a * c - b * s) as f32;
        out[i + half] = (a * s + b * c) as f32;
    }
    out
}

/// Traditional rotary embedding: pairs (2i, 2i + 1).
fn rope_traditional_by_hand(x: &[f32], dims: usize, base: f64, pos: f64) -> Vec<f32> {
    let mut out: Vec<f32> = x.to_vec();
    for i in 0..dims / 2 {
        let theta = pos * base.powf(-2.0 * i as f64 / dims as f64);
        let (s, c) = theta.sin_cos();
        let (a, b) = (f64::from(x[2 * i]), f64::from(x[2 * i + 1]));
        out[2 * i] = (a * c - b * s) as f32;
        out[2 * i + 1] = (a * s + b * c) as f32;
    }
    out
}

const FEATURES: [f32; 8] = [0.3, -1.2, 0.7, 2.0, -0.4, 1.1, 0.9, -0.6];

#[test]
fn rope_at_offset_3_rotates_half_split_pairs() {
    let x = f32s(&FEATURES, &[1, 1, 1, 8]);
    let out = rope(&x, 8, false, 10000.0, 1.0, RopeOffset::Fixed(3)).unwrap();
    assert_array(
        &out,
        &[1, 1, 1, 8],
        &rope_by_hand(&FEATURES, 8, 10000.0, 3.0),
        1e-5,
    );
}

#[test]
fn rope_fixed_and_dynamic_offsets_agree() {
    let x = f32s(&FEATURES, &[1, 1, 1, 8]);
    let fixed = rope(&x, 8, false, 10000.0, 1.0, RopeOffset::Fixed(3)).unwrap();
    let offset = Array::scalar(3.0, Dtype::Int32).unwrap();
    let dynamic = rope(&x, 8, false, 10000.0, 1.0, RopeOffset::Dynamic(&offset)).unwrap();
    assert_close(&read_f32(&dynamic), &read_f32(&fixed), 1e-6);
    assert_close(
        &read_f32(&dynamic),
        &rope_by_hand(&FEATURES, 8, 10000.0, 3.0),
        1e-5,
    );
}

#[test]
fn rope_numbers_consecutive_positions_from_the_offset() {
    // Two positions (rows) at offset 3 are positions 3 and 4.
    let second: Vec<f32> = FEATURES.iter().map(|v| v * 0.5 + 0.1).collect();
    let both: Vec<f32> = FEATURES.iter().chain(&second).copied().collect();
    let out = rope(
        &f32s(&both, &[1, 1, 2, 8]),
        8,
        false,
        10000.0,
        1.0,
        RopeOffset::Fixed(3),
    )
    .unwrap();
    let mut expected = rope_by_hand(&FEATURES, 8, 10000.0, 3.0);
    expected.extend(rope_by_hand(&second, 8, 10000.0, 4.0));
    assert_array(&out, &[1, 1, 2, 8], &expected, 1e-5);
}

#[test]
fn rope_scale_multiplies_the_position() {
    let x = f32s(&FEATURES, &[1, 1, 1, 8]);
    let out = rope(&x, 8, false, 10000.0, 0.5, RopeOffset::Fixed(3)).unwrap();
    assert_close(
        &read_f32(&out),
        &rope_by_hand(&FEATURES, 8, 10000.0, 1.5),
        1e-5,
    );
}

#[test]
fn rope_of_partial_dims_leaves_the_other_features_alone() {
    let x = f32s(&FEATURES, &[1, 1, 1, 8]);
    let out = rope(&x, 4, false, 10000.0, 1.0, RopeOffset::Fixed(3)).unwrap();
    let mut expected = rope_by_hand(&FEATURES[..4], 4, 10000.0, 3.0);
    expected.extend_from_slice(&FEATURES[4..]);
    assert_close(&read_f32(&out), &expected, 1e-5);
}

#[test]
fn rope_traditional_rotates_adjacent_pairs() {
    let x = f32s(&FEATURES, &[1, 1, 1, 8]);
    let out = rope(&x, 8, true, 10000.0, 1.0, RopeOffset::Fixed(3)).unwrap();
    assert_close(
        &read_f32(&out),
        &rope_traditional_by_hand(&FEATURES, 8, 10000.0, 3.0),
        1e-5,
    );
}

/// softmax(q·kᵀ·scale masked) · v with plain ops; `keep` is a boolean mask
/// broadcastable to the scores (true keeps), k and v are broadcast to q's heads.
fn naive_attention(q: &Array, k: &Array, v: &Array, scale: f32, keep: Option<&Array>) -> Array {
    let heads = q.dim(1).unwrap();
    let expand = |a: &Array| {
        let mut shape = a.shape();
        shape[1] = heads;
        a.broadcast_to(&shape).unwrap()
    };
    let (k, v) = (expand(k), expand(v));
    let scores = q
        .matmul(&k.swapaxes(-1, -2).unwrap())
        .unwrap()
        .multiply(&Array::scalar(f64::from(scale), Dtype::Float32).unwrap())
        .unwrap();
    let scores = match keep {
        Some(mask) => where_(
            mask,
            &scores,
            &Array::scalar(f64::NEG_INFINITY, Dtype::Float32).unwrap(),
        )
        .unwrap(),
        None => scores,
    };
    scores.softmax(&[-1], true).unwrap().matmul(&v).unwrap()
}

/// Normal samples of `shape` from a fixed seed.
fn sample(seed: u64, shape: &[i32]) -> Array {
    random::normal(
        shape,
        Dtype::Float32,
        0.0,
        1.0,
        Some(&random::key(seed).unwrap()),
    )
    .unwrap()
}

/// Boolean [L, S] mask where query i sees key j iff j ≤ i + S − L.
fn causal_keep(l: usize, s: usize) -> Array {
    let keep: Vec<bool> = (0..l)
        .flat_map(|i| (0..s).map(move |j| j <= i + s - l))
        .collect();
    bools(&keep, &[l as i32, s as i32])
}

fn check_sdpa(l: i32, s: i32, hq: i32, hkv: i32, mask: AttentionMask<'_>, keep: Option<&Array>) {
    let d = 8;
    let q = sample(1, &[1, hq, l, d]);
    let k = sample(2, &[1, hkv, s, d]);
    let v = sample(3, &[1, hkv, s, d]);
    let scale = 1.0 / (d as f32).sqrt();
    let fused = scaled_dot_product_attention(&q, &k, &v, scale, mask).unwrap();
    assert_eq!(fused.shape(), vec![1, hq, l, d]);
    let naive = naive_attention(&q, &k, &v, scale, keep);
    assert_close(&read_f32(&fused), &read_f32(&naive), 1e-5);
}

#[test]
fn sdpa_without_mask_matches_naive_attention() {
    check_sdpa(3, 5, 2, 2, AttentionMask::None, None);
}

#[test]
fn sdpa_causal_with_as_many_queries_as_keys_matches_a_lower_triangle() {
    let keep = causal_keep(4, 4);
    check_sdpa(4, 4, 2, 2, AttentionMask::Causal, Some(&keep));
}

#[test]
fn sdpa_causal_with_fewer_queries_aligns_to_the_end() {
    // L = 2, S = 5: query 0 sees keys 0..=3, query 1 sees keys 0..=4.
    let keep = causal_keep(2, 5);
    assert_eq!(
        keep.to_vec::<bool>().unwrap(),
        vec![true, true, true, true, false, true, true, true, true, true]
    );
    check_sdpa(2, 5, 2, 2, AttentionMask::Causal, Some(&keep));
}

#[test]
fn sdpa_causal_differs_from_no_mask() {
    let (q, k, v) = (
        sample(1, &[1, 1, 3, 8]),
        sample(2, &[1, 1, 3, 8]),
        sample(3, &[1, 1, 3, 8]),
    );
    let causal =
        read_f32(&scaled_dot_product_attention(&q, &k, &v, 0.5, AttentionMask::Causal).unwrap());
    let open =
        read_f32(&scaled_dot_product_attention(&q, &k, &v, 0.5, AttentionMask::None).unwrap());
    // The last query sees every key either way; the first does not.
    assert_close(&causal[16..], &open[16..], 1e-5);
    assert!(causal[..8]
        .iter()
        .zip(&open[..8])
        .any(|(a, b)| (a - b).abs() > 1e-3));
}

#[test]
fn sdpa_with_a_boolean_array_mask_matches_naive_attention() {
    let keep = bools(
        &[
            true, false, true, true, false, false, true, false, true, true, true, true,
        ],
        &[3, 4],
    );
    check_sdpa(3, 4, 2, 2, AttentionMask::Array(&keep), Some(&keep));
}

#[test]
fn sdpa_with_grouped_query_heads_shares_one_kv_head() {
    check_sdpa(3, 6, 4, 1, AttentionMask::None, None);
    let keep = causal_keep(3, 6);
    check_sdpa(3, 6, 4, 1, AttentionMask::Causal, Some(&keep));
}

#[test]
fn sdpa_of_one_key_returns_its_value() {
    // With a single key the softmax weight is 1.
    let q = sample(4, &[1, 1, 2, 4]);
    let k = sample(5, &[1, 1, 1, 4]);
    let v = f32s(&[1.0, -2.0, 3.0, 0.5], &[1, 1, 1, 4]);
    let out = scaled_dot_product_attention(&q, &k, &v, 1.0, AttentionMask::None).unwrap();
    assert_array(
        &out,
        &[1, 1, 2, 4],
        &[1.0, -2.0, 3.0, 0.5, 1.0, -2.0, 3.0, 0.5],
        1e-6,
    );
}
