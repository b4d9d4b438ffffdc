//! Gathering and scattering by index, sorting and partial selection.

mod common;

use common::{assert_array, f32s, i32s, read_f32};
use mlx_core::Dtype;

#[test]
fn take_gathers_rows_or_columns() {
    let m = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let idx = i32s(&[2, 0, 2], &[3]);
    assert_array(
        &m.take(&idx, 0).unwrap(),
        &[3, 2],
        &[5.0, 6.0, 1.0, 2.0, 5.0, 6.0],
        0.0,
    );
    let col = i32s(&[1], &[1]);
    assert_array(&m.take(&col, 1).unwrap(), &[3, 1], &[2.0, 4.0, 6.0], 0.0);
    // A 2-D index array gives a 2-D result (embedding lookup).
    let table = f32s(&[0.0, 0.5, 10.0, 10.5, 20.0, 20.5], &[3, 2]);
    let tokens = i32s(&[2, 1, 0, 2], &[2, 2]);
    assert_array(
        &table.take(&tokens, 0).unwrap(),
        &[2, 2, 2],
        &[20.0, 20.5, 10.0, 10.5, 0.0, 0.5, 20.0, 20.5],
        0.0,
    );
}

#[test]
fn take_along_axis_picks_one_element_per_row() {
    let m = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let idx = i32s(&[2, 0], &[2, 1]);
    assert_array(
        &m.take_along_axis(&idx, 1).unwrap(),
        &[2, 1],
        &[3.0, 4.0],
        0.0,
    );
}

#[test]
fn put_along_axis_writes_one_element_per_row() {
    let m = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let idx = i32s(&[1, 2], &[2, 1]);
    let values = f32s(&[-1.0, -2.0], &[2, 1]);
    assert_array(
        &m.put_along_axis(&idx, &values, 1).unwrap(),
        &[2, 3],
        &[1.0, -1.0, 3.0, 4.0, 5.0, -2.0],
        0.0,
    );
}

#[test]
fn sort_orders_each_row_or_column() {
    let m = f32s(&[3.0, 1.0, 2.0, 0.0, 5.0, -1.0], &[2, 3]);
    assert_array(
        &m.sort(1).unwrap(),
        &[2, 3],
        &[1.0, 2.0, 3.0, -1.0, 0.0, 5.0],
        0.0,
    );
    assert_array(
        &m.sort(0).unwrap(),
        &[2, 3],
        &[0.0, 1.0, -1.0, 3.0, 5.0, 2.0],
        0.0,
    );
    assert_array(
        &m.sort(-1).unwrap(),
        &[2, 3],
        &[1.0, 2.0, 3.0, -1.0, 0.0, 5.0],
        0.0,
    );
}

#[test]
fn argsort_gives_the_sorting_permutation() {
    let x = f32s(&[30.0, 10.0, 20.0, -5.0], &[4]);
    let idx = x.argsort(0).unwrap();
    assert_eq!(idx.dtype(), Dtype::Uint32);
    assert_eq!(idx.to_vec::<u32>().unwrap(), vec![3, 1, 2, 0]);
}

#[test]
fn argpartition_puts_the_kth_element_in_place_with_smaller_ones_before() {
    let values = [5.0f32, 1.0, 4.0, 2.0, 3.0, 9.0, 0.0];
    let x = f32s(&values, &[7]);
    let kth = 3; // the sorted order is 0 1 2 3 4 5 9: the kth is 3.0
    let idx = x.argpartition(kth, 0).unwrap().to_vec::<u32>().unwrap();
    let picked: Vec<f32> = idx.iter().map(|&i| values[i as usize]).collect();
    assert_eq!(picked[kth as usize], 3.0);
    assert!(
        picked[..kth as usize].iter().all(|&v| v <= 3.0),
        "{picked:?}"
    );
    assert!(
        picked[kth as usize + 1..].iter().all(|&v| v >= 3.0),
        "{picked:?}"
    );
    let mut sorted_idx = idx.clone();
    sorted_idx.sort_unstable();
    assert_eq!(sorted_idx, vec![0, 1, 2, 3, 4, 5, 6], "a permutation");
}

#[test]
fn topk_returns_the_k_largest_values_as_a_set() {
    let x = f32s(&[5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 0.0], &[7]);
    let mut top = read_f32(&x.topk(3, 0).unwrap());
    top.sort_by(f32::total_cmp);
    assert_eq!(top, vec![4.0, 5.0, 9.0]);
    // Per row of a matrix.
    let m = f32s(&[1.0, 8.0, 3.0, 7.0, 2.0, 6.0], &[2, 3]);
    let rows = m.topk(1, 1).unwrap();
    assert_array(&rows, &[2, 1], &[8.0, 7.0], 0.0);
}
