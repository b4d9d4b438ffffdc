//! Affine quantization: error bounds, packed shapes, quantized matmul.

mod common;

use common::{assert_close, read_f32};
use mlx_core::{quantize, random, Array, Dtype};

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

// MLX's affine scheme per group: step s₀ = (max − min) / (2^bits − 1), then
// the grid is anchored at the end of larger magnitude ("edge") and its step
// adjusted to edge / round(edge / s₀) so that 0 is exactly a level. Values
// inside the grid's span are within half a (returned) step of a level; the
// far end of the range may fall short of the grid by up to one step s₀, so
// the overall bound is s₀ — not s₀ / 2 (checked with Python MLX 0.32.4: a
// 4-bit group spanning [-1, 1] gets step 1/7 and levels -1 … 8/7).

#[test]
fn dequantized_values_are_the_nearest_level_of_their_group_grid() {
    let (rows, cols) = (4usize, 256usize);
    let w = sample(11, &[rows as i32, cols as i32]);
    let original = read_f32(&w);
    for bits in [2, 3, 4, 5, 6, 8] {
        for group in [32usize, 64, 128] {
            let q = quantize(&w, group as i32, bits).unwrap();
            let restored = read_f32(&q.dequantize().unwrap());
            let scales = read_f32(&q.scales);
            let biases = read_f32(&q.biases);
            let levels = (1usize << bits) - 1;
            assert_eq!(restored.len(), original.len());
            for (g, (orig, rest)) in original
                .chunks(group)
                .zip(restored.chunks(group))
                .enumerate()
            {
                let grid: Vec<f32> = (0..=levels)
                    .map(|k| biases[g] + k as f32 * scales[g])
                    .collect();
                let (lo, hi) = (grid[0].min(grid[levels]), grid[0].max(grid[levels]));
                let max = orig.iter().copied().fold(f32::MIN, f32::max);
                let min = orig.iter().copied().fold(f32::MAX, f32::min);
                let step = (max - min) / levels as f32;
                let slack = 1e-5 * max.abs().max(min.abs());
                for (i, (&o, &r)) in orig.iter().zip(rest).enumerate() {
                    let context = format!(
                        "bits {bits}, group {group}: group {g} element {i}: {o} came back as {r}"
                    );
                    let nearest = grid.iter().fold(f32::MAX, |m, &l| m.min((l - o).abs()));
                    assert!(
                        (r - o).abs() <= nearest + slack,
                        "{context}: a level {nearest} away exists"
                    );
                    assert!(
                        (r - o).abs() <= step + slack,
                        "{context}: more than one step {step}"
                    );
                    if (lo..=hi).contains(&o) {
                        let half = scales[g].abs() / 2.0;
                        assert!(
                            (r - o).abs() <= half + slack,
                            "{context}: inside the grid, over half a step {half}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn zero_survives_affine_quantization_exactly() {
    let mut values: Vec<f32> = read_f32(&sample(13, &[64]));
    values[5] = 0.0;
    values[40] = 0.0;
    let w = Array::from_slice(&values, &[1, 64]).unwrap();
    for bits in [2, 3, 4, 8] {
        let restored = read_f32(&quantize(&w, 32, bits).unwrap().dequantize().unwrap());
        assert_eq!((restored[5], restored[40]), (0.0, 0.0), "bits {bits}");
    }
}

#[test]
fn packed_scales_and_biases_have_the_documented_shapes() {
    let (rows, cols) = (4, 256);
    let w = sample(12, &[rows, cols]);
    for bits in [2, 3, 4, 5, 6, 8] {
        for group in [32, 64, 128] {
            let q = quantize(&w, group, bits).unwrap();
            assert_eq!(
                q.packed.shape(),
                vec![rows, cols * bits / 32],
                "bits {bits} group {group}"
            );
            assert_eq!(q.packed.dtype(), Dtype::Uint32);
            assert_eq!(q.scales.shape(), vec![rows, cols / group]);
            assert_eq!(q.biases.shape(), vec![rows, cols / group]);
            assert_eq!(q.scales.dtype(), Dtype::Float32);
            assert_eq!((q.bits, q.group_size), (bits, group));
            let expected_bytes =
                (rows * cols * bits / 32 * 4 + 2 * rows * cols / group * 4) as usize;
            assert_eq!(q.nbytes(), expected_bytes);
        }
    }
}

#[test]
fn a_group_on_a_grid_through_zero_quantizes_exactly() {
    // 16 levels k · 0.1 for k = −7 … 8: the 4-bit grid MLX picks for this
    // range (step 1.5 / 15 = 0.1, anchored at 0.8) holds every one of them.
    let values: Vec<f32> = (0..32).map(|i| ((i % 16) as f32 - 7.0) * 0.1).collect();
    let w = Array::from_slice(&values, &[1, 32]).unwrap();
    let q = quantize(&w, 32, 4).unwrap();
    assert_close(&read_f32(&q.dequantize().unwrap()), &values, 1e-6);
    assert_close(
        &read_f32(&q.scales)
            .iter()
            .map(|s| s.abs())
            .collect::<Vec<_>>(),
        &[0.1],
        1e-6,
    );
}

/// Largest |a − b| relative to the largest |b|.
fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

#[test]
fn quantized_matmul_with_transpose_equals_matmul_with_the_dequantized_matrix_transposed() {
    let x = sample(21, &[3, 256]);
    let w = sample(22, &[64, 256]);
    for bits in [4, 8] {
        let q = quantize(&w, 64, bits).unwrap();
        let fused = q.matmul(&x, true).unwrap();
        assert_eq!(fused.shape(), vec![3, 64]);
        let reference = x.matmul(&q.dequantize().unwrap().t().unwrap()).unwrap();
        let err = relative_error(&read_f32(&fused), &read_f32(&reference));
        assert!(err <= 1e-4, "bits {bits}: relative error {err}");
    }
}

#[test]
fn quantized_matmul_without_transpose_equals_matmul_with_the_dequantized_matrix() {
    let x = sample(23, &[3, 256]);
    let w = sample(24, &[256, 128]);
    for bits in [4, 8] {
        let q = quantize(&w, 64, bits).unwrap();
        let fused = q.matmul(&x, false).unwrap();
        assert_eq!(fused.shape(), vec![3, 128]);
        let reference = x.matmul(&q.dequantize().unwrap()).unwrap();
        let err = relative_error(&read_f32(&fused), &read_f32(&reference));
        assert!(err <= 1e-4, "bits {bits}: relative error {err}");
    }
}

#[test]
fn quantized_matmul_is_close_to_the_full_precision_product_at_8_bits() {
    let x = sample(25, &[2, 128]);
    let w = sample(26, &[16, 128]);
    let q = quantize(&w, 32, 8).unwrap();
    let fused = read_f32(&q.matmul(&x, true).unwrap());
    let exact = read_f32(&x.matmul(&w.t().unwrap()).unwrap());
    // 8-bit steps are ≈ 1/255 of a group's range: the product stays within 1 %.
    assert!(relative_error(&fused, &exact) < 1e-2);
}
