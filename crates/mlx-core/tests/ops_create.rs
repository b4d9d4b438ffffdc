//! Creation of arrays: ranges, constants and triangles.

mod common;

use common::{assert_array, f32s, read_f32};
use mlx_core::{arange, full, ones, tri, zeros, Array, Dtype};

#[test]
fn arange_counts_from_start_below_stop_by_step() {
    assert_array(
        &arange(0.0, 5.0, 1.0, Dtype::Float32).unwrap(),
        &[5],
        &[0.0, 1.0, 2.0, 3.0, 4.0],
        0.0,
    );
    assert_array(
        &arange(1.0, 2.0, 0.25, Dtype::Float32).unwrap(),
        &[4],
        &[1.0, 1.25, 1.5, 1.75],
        0.0,
    );
    assert_array(
        &arange(3.0, 0.0, -1.0, Dtype::Float32).unwrap(),
        &[3],
        &[3.0, 2.0, 1.0],
        0.0,
    );
    let ints = arange(-2.0, 7.0, 3.0, Dtype::Int32).unwrap();
    assert_eq!(ints.dtype(), Dtype::Int32);
    assert_eq!(ints.to_vec::<i32>().unwrap(), vec![-2, 1, 4]);
}

#[test]
fn full_fills_with_a_value_converted_to_the_dtype() {
    let seven = Array::scalar(7.0, Dtype::Float32).unwrap();
    assert_array(
        &full(&[2, 2], &seven, Dtype::Float32).unwrap(),
        &[2, 2],
        &[7.0; 4],
        0.0,
    );
    let ints = full(
        &[3],
        &Array::scalar(2.9, Dtype::Float32).unwrap(),
        Dtype::Int32,
    )
    .unwrap();
    assert_eq!(ints.to_vec::<i32>().unwrap(), vec![2, 2, 2]);
    // A row value broadcasts over the shape.
    let row = f32s(&[1.0, 2.0], &[2]);
    assert_array(
        &full(&[2, 2], &row, Dtype::Float32).unwrap(),
        &[2, 2],
        &[1.0, 2.0, 1.0, 2.0],
        0.0,
    );
}

#[test]
fn zeros_and_ones_in_several_dtypes() {
    assert_array(
        &zeros(&[2, 3], Dtype::Float32).unwrap(),
        &[2, 3],
        &[0.0; 6],
        0.0,
    );
    assert_array(&ones(&[4], Dtype::Float32).unwrap(), &[4], &[1.0; 4], 0.0);
    assert_eq!(
        ones(&[2], Dtype::Int64).unwrap().to_vec::<i64>().unwrap(),
        vec![1, 1]
    );
    assert_eq!(
        zeros(&[2], Dtype::Bool).unwrap().to_vec::<bool>().unwrap(),
        vec![false, false]
    );
    assert_eq!(
        ones(&[1], Dtype::Bfloat16)
            .unwrap()
            .to_vec::<half::bf16>()
            .unwrap(),
        vec![half::bf16::ONE]
    );
    assert_eq!(zeros(&[], Dtype::Float32).unwrap().ndim(), 0);
}

#[test]
fn tri_has_ones_at_and_below_diagonal_k() {
    assert_array(
        &tri(3, 4, 0, Dtype::Float32).unwrap(),
        &[3, 4],
        &[1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0],
        0.0,
    );
    assert_array(
        &tri(3, 3, -1, Dtype::Float32).unwrap(),
        &[3, 3],
        &[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0],
        0.0,
    );
    let mask = tri(2, 3, 1, Dtype::Bool).unwrap();
    assert_eq!(
        mask.to_vec::<bool>().unwrap(),
        vec![true, true, false, true, true, true]
    );
}

/// [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
fn m33() -> Array {
    f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], &[3, 3])
}

#[test]
fn tril_keeps_the_lower_triangle() {
    assert_eq!(
        read_f32(&m33().tril(0).unwrap()),
        vec![1.0, 0.0, 0.0, 4.0, 5.0, 0.0, 7.0, 8.0, 9.0]
    );
    assert_eq!(
        read_f32(&m33().tril(1).unwrap()),
        vec![1.0, 2.0, 0.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    );
    assert_eq!(
        read_f32(&m33().tril(-1).unwrap()),
        vec![0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 7.0, 8.0, 0.0]
    );
}

#[test]
fn triu_keeps_the_upper_triangle() {
    assert_eq!(
        read_f32(&m33().triu(0).unwrap()),
        vec![1.0, 2.0, 3.0, 0.0, 5.0, 6.0, 0.0, 0.0, 9.0]
    );
    assert_eq!(
        read_f32(&m33().triu(1).unwrap()),
        vec![0.0, 2.0, 3.0, 0.0, 0.0, 6.0, 0.0, 0.0, 0.0]
    );
    assert_eq!(
        read_f32(&m33().triu(-1).unwrap()),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 8.0, 9.0]
    );
}
