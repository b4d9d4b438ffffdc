//! Reductions, arg-reductions, scans and softmax.

mod common;

use std::f32::consts::LN_2;

use common::{assert_array, assert_close, bools, f32s, read_f32};
use mlx_core::{random, Dtype};

/// [[1, 2, 3], [4, 5, 6]]
fn m23() -> mlx_core::Array {
    f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])
}

#[test]
fn sum_over_each_axis_over_all_and_with_keepdims() {
    let m = m23();
    assert_array(&m.sum(&[0], false).unwrap(), &[3], &[5.0, 7.0, 9.0], 0.0);
    assert_array(&m.sum(&[1], false).unwrap(), &[2], &[6.0, 15.0], 0.0);
    assert_array(&m.sum(&[-1], true).unwrap(), &[2, 1], &[6.0, 15.0], 0.0);
    assert_array(&m.sum(&[0, 1], false).unwrap(), &[], &[21.0], 0.0);
    let total = m.sum_all().unwrap();
    assert_eq!(total.ndim(), 0);
    assert_eq!(total.item::<f32>().unwrap(), 21.0);
}

#[test]
fn sum_over_two_of_three_axes() {
    // x[i][j][k] = 4i + 2j + k; summing over i and k leaves j:
    // j = 0: 0+1+4+5 = 10, j = 1: 2+3+6+7 = 18.
    let x = f32s(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], &[2, 2, 2]);
    assert_array(&x.sum(&[0, 2], false).unwrap(), &[2], &[10.0, 18.0], 0.0);
    assert_array(
        &x.sum(&[0, 2], true).unwrap(),
        &[1, 2, 1],
        &[10.0, 18.0],
        0.0,
    );
}

#[test]
fn mean_prod_max_and_min() {
    let m = m23();
    assert_array(&m.mean(&[1], false).unwrap(), &[2], &[2.0, 5.0], 0.0);
    assert_eq!(m.mean_all().unwrap().item::<f32>().unwrap(), 3.5);
    assert_array(&m.prod(&[0], false).unwrap(), &[3], &[4.0, 10.0, 18.0], 0.0);
    assert_eq!(m.prod_all().unwrap().item::<f32>().unwrap(), 720.0);
    assert_array(&m.max(&[0], false).unwrap(), &[3], &[4.0, 5.0, 6.0], 0.0);
    assert_eq!(m.max_all().unwrap().item::<f32>().unwrap(), 6.0);
    assert_array(&m.min(&[1], true).unwrap(), &[2, 1], &[1.0, 4.0], 0.0);
    assert_eq!(m.min_all().unwrap().item::<f32>().unwrap(), 1.0);
}

#[test]
fn all_and_any_over_rows_and_everything() {
    let b = bools(&[true, true, false, false], &[2, 2]);
    assert_eq!(
        b.all(&[1], false).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false]
    );
    assert_eq!(
        b.any(&[1], false).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false]
    );
    assert_eq!(
        b.any(&[0], false).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true]
    );
    assert!(!b.all_all().unwrap().item::<bool>().unwrap());
    assert!(b.any_all().unwrap().item::<bool>().unwrap());
}

#[test]
fn logsumexp_is_the_log_of_summed_exponentials() {
    // log(1 + 2 + 5) = log 8
    let x = f32s(&[0.0, LN_2, 5f32.ln()], &[3]);
    assert_close(&read_f32(&x.logsumexp_all().unwrap()), &[8f32.ln()], 1e-6);
    // Stable for large inputs: log(e^1000 + e^1000) = 1000 + ln 2.
    let big = f32s(&[1000.0, 1000.0, 0.0, LN_2], &[2, 2]);
    assert_close(
        &read_f32(&big.logsumexp(&[1], false).unwrap()),
        &[1000.0 + LN_2, 3f32.ln()],
        1e-6,
    );
    assert_eq!(big.logsumexp(&[1], true).unwrap().shape(), vec![2, 1]);
}

#[test]
fn argmax_and_argmin_along_an_axis_give_uint32_indices() {
    let x = f32s(&[1.0, 5.0, 2.0, 7.0, 0.0, 3.0], &[2, 3]);
    let amax = x.argmax(1, false).unwrap();
    assert_eq!(amax.dtype(), Dtype::Uint32);
    assert_eq!(amax.to_vec::<u32>().unwrap(), vec![1, 0]);
    assert_eq!(
        x.argmin(1, false).unwrap().to_vec::<u32>().unwrap(),
        vec![0, 1]
    );
    assert_eq!(
        x.argmax(0, false).unwrap().to_vec::<u32>().unwrap(),
        vec![1, 0, 1]
    );
    let kept = x.argmin(0, true).unwrap();
    assert_eq!(kept.shape(), vec![1, 3]);
    assert_eq!(kept.to_vec::<u32>().unwrap(), vec![0, 1, 0]);
}

#[test]
fn cumsum_inclusive_exclusive_and_reversed() {
    let x = f32s(&[1.0, 2.0, 3.0, 4.0], &[4]);
    assert_eq!(
        read_f32(&x.cumsum(0, false, true).unwrap()),
        vec![1.0, 3.0, 6.0, 10.0]
    );
    assert_eq!(
        read_f32(&x.cumsum(0, false, false).unwrap()),
        vec![0.0, 1.0, 3.0, 6.0]
    );
    assert_eq!(
        read_f32(&x.cumsum(0, true, true).unwrap()),
        vec![10.0, 9.0, 7.0, 4.0]
    );
    assert_eq!(
        read_f32(&x.cumsum(0, true, false).unwrap()),
        vec![9.0, 7.0, 4.0, 0.0]
    );
}

#[test]
fn cumsum_along_the_rows_of_a_matrix() {
    assert_array(
        &m23().cumsum(1, false, true).unwrap(),
        &[2, 3],
        &[1.0, 3.0, 6.0, 4.0, 9.0, 15.0],
        0.0,
    );
    assert_array(
        &m23().cumsum(0, false, true).unwrap(),
        &[2, 3],
        &[1.0, 2.0, 3.0, 5.0, 7.0, 9.0],
        0.0,
    );
}

#[test]
fn cumprod_cummax_cummin_and_logcumsumexp() {
    let x = f32s(&[1.0, 2.0, 3.0, 4.0], &[4]);
    assert_eq!(
        read_f32(&x.cumprod(0, false, true).unwrap()),
        vec![1.0, 2.0, 6.0, 24.0]
    );
    let y = f32s(&[1.0, 3.0, 2.0, 5.0], &[4]);
    assert_eq!(
        read_f32(&y.cummax(0, false, true).unwrap()),
        vec![1.0, 3.0, 3.0, 5.0]
    );
    let z = f32s(&[3.0, 1.0, 2.0, 0.0], &[4]);
    assert_eq!(
        read_f32(&z.cummin(0, false, true).unwrap()),
        vec![3.0, 1.0, 1.0, 0.0]
    );
    // log(1), log(1 + 1), log(1 + 1 + 2)
    let w = f32s(&[0.0, 0.0, LN_2], &[3]);
    assert_close(
        &read_f32(&w.logcumsumexp(0, false, true).unwrap()),
        &[0.0, LN_2, 2.0 * LN_2],
        1e-6,
    );
}

#[test]
fn softmax_of_zero_and_ln2_is_one_third_and_two_thirds() {
    let x = f32s(&[0.0, LN_2], &[2]);
    assert_close(
        &read_f32(&x.softmax(&[0], false).unwrap()),
        &[1.0 / 3.0, 2.0 / 3.0],
        1e-6,
    );
    assert_close(
        &read_f32(&x.softmax(&[-1], true).unwrap()),
        &[1.0 / 3.0, 2.0 / 3.0],
        1e-6,
    );
}

#[test]
fn softmax_rows_sum_to_one_and_ignore_a_shift() {
    let key = random::key(7).unwrap();
    let x = random::normal(&[5, 11], Dtype::Float32, 0.0, 3.0, Some(&key)).unwrap();
    let p = x.softmax(&[1], false).unwrap();
    assert_close(&read_f32(&p.sum(&[1], false).unwrap()), &[1.0; 5], 1e-6);
    assert!(read_f32(&p).iter().all(|&v| v > 0.0 && v < 1.0));
    // softmax(x + c) = softmax(x), even for a large c.
    let shifted = x
        .add(&mlx_core::Array::scalar(500.0, Dtype::Float32).unwrap())
        .unwrap()
        .softmax(&[1], false)
        .unwrap();
    assert_close(&read_f32(&shifted), &read_f32(&p), 1e-4);
}

#[test]
fn precise_softmax_of_bfloat16_matches_the_float32_result_after_rounding() {
    let x = f32s(&[0.0, LN_2, 2.0 * LN_2], &[3]); // weights 1 : 2 : 4
    let p = x
        .astype(Dtype::Bfloat16)
        .unwrap()
        .softmax(&[0], true)
        .unwrap();
    assert_eq!(p.dtype(), Dtype::Bfloat16);
    let back = read_f32(&p.astype(Dtype::Float32).unwrap());
    assert_close(&back, &[1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0], 2f32.powi(-8));
}
