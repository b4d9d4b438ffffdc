//! Matrix products.

mod common;

use common::{assert_array, f32s};

/// [[1, 2, 3], [4, 5, 6]] and [[7, 8], [9, 10], [11, 12]]
fn pair() -> (mlx_core::Array, mlx_core::Array) {
    (
        f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]),
        f32s(&[7.0, 8.0, 9.0, 10.0, 11.0, 12.0], &[3, 2]),
    )
}

#[test]
fn matmul_of_2x3_and_3x2_by_hand() {
    // [1·7 + 2·9 + 3·11, 1·8 + 2·10 + 3·12; 4·7 + 5·9 + 6·11, 4·8 + 5·10 + 6·12]
    let (a, b) = pair();
    assert_array(
        &a.matmul(&b).unwrap(),
        &[2, 2],
        &[58.0, 64.0, 139.0, 154.0],
        0.0,
    );
    // And the other way round: 3x2 @ 2x3.
    assert_array(
        &b.matmul(&a).unwrap(),
        &[3, 3],
        &[39.0, 54.0, 69.0, 49.0, 68.0, 87.0, 59.0, 82.0, 105.0],
        0.0,
    );
}

#[test]
fn matmul_batches_over_leading_axes_and_broadcasts() {
    // Two 2x2 matrices times one shared 2x2 matrix.
    let batch = f32s(&[1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 3.0], &[2, 2, 2]);
    let m = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    assert_array(
        &batch.matmul(&m).unwrap(),
        &[2, 2, 2],
        &[1.0, 2.0, 3.0, 4.0, 2.0, 4.0, 9.0, 12.0],
        0.0,
    );
}

#[test]
fn matmul_of_a_transposed_view_uses_its_values() {
    let (a, _) = pair();
    // a @ aᵀ = [[14, 32], [32, 77]]
    assert_array(
        &a.matmul(&a.t().unwrap()).unwrap(),
        &[2, 2],
        &[14.0, 32.0, 32.0, 77.0],
        0.0,
    );
}

#[test]
fn addmm_is_alpha_times_product_plus_beta_times_c() {
    let (a, b) = pair();
    let c = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    // 2 · [[58, 64], [139, 154]] + 0.5 · [[1, 2], [3, 4]]
    assert_array(
        &c.addmm(&a, &b, 2.0, 0.5).unwrap(),
        &[2, 2],
        &[116.5, 129.0, 279.5, 310.0],
        0.0,
    );
    // A broadcast bias row.
    let bias = f32s(&[10.0, 20.0], &[2]);
    assert_array(
        &bias.addmm(&a, &b, 1.0, 1.0).unwrap(),
        &[2, 2],
        &[68.0, 84.0, 149.0, 174.0],
        0.0,
    );
}
