//! Shape changes, slicing, slice updates, concatenation and stacking.

mod common;

use common::{assert_array, f32s, i32s, read_f32};
use mlx_core::{arange, concatenate, ones, stack, zeros, Array, Dtype};

/// 0, 1, …, n − 1 as float32 with the given shape.
fn iota(shape: &[i32]) -> Array {
    let n: i32 = shape.iter().product();
    arange(0.0, f64::from(n), 1.0, Dtype::Float32)
        .unwrap()
        .reshape(shape)
        .unwrap()
}

#[test]
fn reshape_infers_one_dimension_from_minus_one() {
    let a = iota(&[6]);
    let b = a.reshape(&[2, -1]).unwrap();
    assert_array(&b, &[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 0.0);
    assert_eq!(a.reshape(&[-1, 2, 1]).unwrap().shape(), vec![3, 2, 1]);
}

#[test]
fn transpose_with_explicit_axes_permutes_a_3d_array() {
    // x[i][j][k] = 6i + 3j + k with shape [2, 2, 3]; y = x.transpose([2, 0, 1])
    // has shape [3, 2, 2] and y[k][i][j] = x[i][j][k].
    let x = iota(&[2, 2, 3]);
    let y = x.transpose(&[2, 0, 1]).unwrap();
    let mut expected = Vec::new();
    for k in 0..3 {
        for i in 0..2 {
            for j in 0..2 {
                expected.push((6 * i + 3 * j + k) as f32);
            }
        }
    }
    assert_array(&y, &[3, 2, 2], &expected, 0.0);
    let m = iota(&[2, 3]);
    assert_array(
        &m.transpose(&[1, 0]).unwrap(),
        &[3, 2],
        &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0],
        0.0,
    );
}

#[test]
fn t_reverses_every_axis() {
    let x = iota(&[2, 1, 3]);
    let y = x.t().unwrap();
    assert_array(&y, &[3, 1, 2], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], 0.0);
}

#[test]
fn swapaxes_exchanges_two_axes() {
    let x = iota(&[2, 3, 1]);
    let y = x.swapaxes(0, 1).unwrap();
    assert_array(&y, &[3, 2, 1], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], 0.0);
    assert_eq!(x.swapaxes(-1, 0).unwrap().shape(), vec![1, 3, 2]);
}

#[test]
fn expand_dims_and_squeeze_add_and_remove_unit_axes() {
    let x = iota(&[2, 3]);
    let e = x.expand_dims(&[0, 2]).unwrap();
    assert_eq!(e.shape(), vec![1, 2, 1, 3]);
    assert_eq!(read_f32(&e), read_f32(&x));
    assert_eq!(e.squeeze(&[0]).unwrap().shape(), vec![2, 1, 3]);
    assert_eq!(e.squeeze(&[0, 2]).unwrap().shape(), vec![2, 3]);
    assert_eq!(e.squeeze(&[-2]).unwrap().shape(), vec![1, 2, 3]);
}

#[test]
fn broadcast_to_repeats_along_new_and_unit_axes() {
    let row = f32s(&[1.0, 2.0, 3.0], &[3]);
    assert_array(
        &row.broadcast_to(&[2, 3]).unwrap(),
        &[2, 3],
        &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0],
        0.0,
    );
    let col = f32s(&[1.0, 2.0], &[2, 1]);
    assert_array(
        &col.broadcast_to(&[2, 2]).unwrap(),
        &[2, 2],
        &[1.0, 1.0, 2.0, 2.0],
        0.0,
    );
}

#[test]
fn flatten_merges_a_range_of_axes() {
    let x = iota(&[2, 3, 2]);
    assert_eq!(x.flatten(0, 1).unwrap().shape(), vec![6, 2]);
    assert_eq!(x.flatten(1, -1).unwrap().shape(), vec![2, 6]);
    let all = x.flatten(0, -1).unwrap();
    assert_array(&all, &[12], &read_f32(&iota(&[12])), 0.0);
}

#[test]
fn contiguous_copy_of_a_transpose_has_the_transposed_values() {
    let t = iota(&[2, 3]).t().unwrap();
    let c = t.contiguous().unwrap();
    assert_array(&c, &[3, 2], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], 0.0);
}

#[test]
fn slice_with_strides_picks_every_nth_element() {
    let x = iota(&[10]);
    assert_array(
        &x.slice(&[1], &[8], &[3]).unwrap(),
        &[3],
        &[1.0, 4.0, 7.0],
        0.0,
    );
    assert_array(
        &x.slice(&[0], &[10], &[4]).unwrap(),
        &[3],
        &[0.0, 4.0, 8.0],
        0.0,
    );
    // A 2-D block: rows 1..3, columns 0, 2.
    let m = iota(&[3, 4]);
    assert_array(
        &m.slice(&[1, 0], &[3, 4], &[1, 2]).unwrap(),
        &[2, 2],
        &[4.0, 6.0, 8.0, 10.0],
        0.0,
    );
}

#[test]
fn slice_dynamic_starts_at_positions_held_in_an_array() {
    let x = iota(&[10]);
    let start = i32s(&[3], &[1]);
    assert_array(
        &x.slice_dynamic(&start, &[0], &[4]).unwrap(),
        &[4],
        &[3.0, 4.0, 5.0, 6.0],
        0.0,
    );
    // Along the second axis of a matrix; the first axis is kept whole.
    let m = iota(&[2, 5]);
    let col = i32s(&[2], &[1]);
    assert_array(
        &m.slice_dynamic(&col, &[1], &[2, 2]).unwrap(),
        &[2, 2],
        &[2.0, 3.0, 7.0, 8.0],
        0.0,
    );
}

#[test]
fn slice_update_writes_a_strided_block() {
    let x = zeros(&[5], Dtype::Float32).unwrap();
    let update = f32s(&[1.0, 2.0], &[2]);
    let y = x.slice_update(&update, &[1], &[5], &[2]).unwrap();
    assert_array(&y, &[5], &[0.0, 1.0, 0.0, 2.0, 0.0], 0.0);
    // The source is unchanged.
    assert_eq!(read_f32(&x), vec![0.0; 5]);
}

#[test]
fn slice_update_dynamic_writes_a_block_at_positions_held_in_an_array() {
    let x = zeros(&[2, 4], Dtype::Float32).unwrap();
    let update = ones(&[1, 2], Dtype::Float32).unwrap();
    let start = i32s(&[1, 2], &[2]);
    let y = x.slice_update_dynamic(&update, &start, &[0, 1]).unwrap();
    assert_array(&y, &[2, 4], &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0], 0.0);
}

#[test]
fn concatenate_joins_along_an_existing_axis() {
    let a = f32s(&[1.0, 2.0], &[1, 2]);
    let b = f32s(&[3.0, 4.0, 5.0, 6.0], &[2, 2]);
    assert_array(
        &concatenate(&[&a, &b], 0).unwrap(),
        &[3, 2],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        0.0,
    );
    let c = f32s(&[7.0, 8.0], &[2, 1]);
    assert_array(
        &concatenate(&[&b, &c], 1).unwrap(),
        &[2, 3],
        &[3.0, 4.0, 7.0, 5.0, 6.0, 8.0],
        0.0,
    );
}

#[test]
fn stack_joins_along_a_new_axis() {
    let a = f32s(&[1.0, 2.0], &[2]);
    let b = f32s(&[3.0, 4.0], &[2]);
    assert_array(
        &stack(&[&a, &b], 0).unwrap(),
        &[2, 2],
        &[1.0, 2.0, 3.0, 4.0],
        0.0,
    );
    assert_array(
        &stack(&[&a, &b], 1).unwrap(),
        &[2, 2],
        &[1.0, 3.0, 2.0, 4.0],
        0.0,
    );
}
