//! Elementwise operations of one and two arrays, where, clip and astype.

mod common;

use std::f32::consts::{E, LN_2, PI};

use common::{assert_array, assert_close, bools, f32s, i32s, read_f32};
use mlx_core::{where_, Array, Dtype};

fn unary(f: impl Fn(&Array) -> mlx_core::Result<Array>, input: &[f32]) -> Vec<f32> {
    let out = f(&f32s(input, &[input.len() as i32])).unwrap();
    assert_eq!(out.shape(), vec![input.len() as i32]);
    read_f32(&out)
}

fn flags(a: &Array) -> Vec<bool> {
    assert_eq!(a.dtype(), Dtype::Bool);
    a.to_vec::<bool>().unwrap()
}

#[test]
fn abs_negative_and_sign() {
    assert_eq!(unary(Array::abs, &[-2.0, 0.0, 3.5]), vec![2.0, 0.0, 3.5]);
    assert_eq!(
        unary(Array::negative, &[-2.0, 0.0, 3.5]),
        vec![2.0, 0.0, -3.5]
    );
    assert_eq!(unary(Array::sign, &[-2.0, 0.0, 3.5]), vec![-1.0, 0.0, 1.0]);
}

#[test]
fn powers_and_roots() {
    assert_eq!(unary(Array::square, &[1.5, -3.0]), vec![2.25, 9.0]);
    assert_eq!(unary(Array::sqrt, &[4.0, 2.25, 0.0]), vec![2.0, 1.5, 0.0]);
    assert_close(&unary(Array::rsqrt, &[4.0, 0.25]), &[0.5, 2.0], 1e-6);
    assert_eq!(unary(Array::reciprocal, &[4.0, -0.5]), vec![0.25, -2.0]);
}

#[test]
fn exponentials_and_logarithms() {
    assert_close(&unary(Array::exp, &[0.0, 1.0, LN_2]), &[1.0, E, 2.0], 1e-6);
    assert_close(&unary(Array::log, &[1.0, E, 0.5]), &[0.0, 1.0, -LN_2], 1e-6);
    assert_close(&unary(Array::log1p, &[0.0, E - 1.0]), &[0.0, 1.0], 1e-6);
    // log1p keeps precision where log(1 + x) would lose it: log1p(x) ≈ x − x²/2.
    let tiny = unary(Array::log1p, &[1e-7])[0];
    assert!((tiny - 1e-7).abs() < 1e-13, "log1p(1e-7) = {tiny}");
}

#[test]
fn trigonometric_and_hyperbolic_functions() {
    assert_close(
        &unary(Array::sin, &[0.0, PI / 2.0, PI / 6.0]),
        &[0.0, 1.0, 0.5],
        1e-6,
    );
    assert_close(
        &unary(Array::cos, &[0.0, PI, PI / 3.0]),
        &[1.0, -1.0, 0.5],
        1e-6,
    );
    // tanh(ln 2) = (4 − 1) / (4 + 1) = 0.6
    assert_close(
        &unary(Array::tanh, &[0.0, LN_2, -LN_2]),
        &[0.0, 0.6, -0.6],
        1e-6,
    );
}

#[test]
fn sigmoid_and_erf() {
    // σ(ln 3) = 3 / (3 + 1)
    assert_close(
        &unary(Array::sigmoid, &[0.0, 3f32.ln(), -(3f32.ln())]),
        &[0.5, 0.75, 0.25],
        1e-6,
    );
    // erf(1) = 0.8427007929…, erf is odd.
    assert_close(
        &unary(Array::erf, &[0.0, 1.0, -1.0]),
        &[0.0, 0.842_700_8, -0.842_700_8],
        1e-6,
    );
}

#[test]
fn floor_ceil_and_round_half_to_even() {
    assert_eq!(unary(Array::floor, &[-1.5, 1.5, 2.0]), vec![-2.0, 1.0, 2.0]);
    assert_eq!(unary(Array::ceil, &[-1.5, 1.5, 2.0]), vec![-1.0, 2.0, 2.0]);
    assert_eq!(
        unary(Array::round, &[0.5, 1.5, 2.5, -0.5, 2.6, -2.6]),
        vec![0.0, 2.0, 2.0, 0.0, 3.0, -3.0]
    );
}

#[test]
fn isfinite_isnan_and_isinf_on_special_values() {
    let x = f32s(
        &[1.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0],
        &[5],
    );
    assert_eq!(
        flags(&x.isfinite().unwrap()),
        vec![true, false, false, false, true]
    );
    assert_eq!(
        flags(&x.isnan().unwrap()),
        vec![false, false, false, true, false]
    );
    assert_eq!(
        flags(&x.isinf().unwrap()),
        vec![false, true, true, false, false]
    );
}

#[test]
fn logical_not_flips_booleans() {
    let b = bools(&[true, false], &[2]);
    assert_eq!(flags(&b.logical_not().unwrap()), vec![false, true]);
}

#[test]
fn stop_gradient_and_copy_keep_the_values() {
    assert_eq!(unary(Array::stop_gradient, &[1.0, -2.0]), vec![1.0, -2.0]);
    assert_eq!(unary(Array::copy, &[1.0, -2.0]), vec![1.0, -2.0]);
}

#[test]
fn arithmetic_broadcasts_a_row_over_a_matrix() {
    let m = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let row = f32s(&[10.0, 20.0, 30.0], &[3]);
    assert_array(
        &m.add(&row).unwrap(),
        &[2, 3],
        &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0],
        0.0,
    );
    assert_array(
        &m.subtract(&row).unwrap(),
        &[2, 3],
        &[-9.0, -18.0, -27.0, -6.0, -15.0, -24.0],
        0.0,
    );
    assert_array(
        &m.multiply(&row).unwrap(),
        &[2, 3],
        &[10.0, 40.0, 90.0, 40.0, 100.0, 180.0],
        0.0,
    );
    assert_array(
        &m.divide(&row).unwrap(),
        &[2, 3],
        &[0.1, 0.1, 0.1, 0.4, 0.25, 0.2],
        1e-6,
    );
}

#[test]
fn a_column_and_a_row_broadcast_to_an_outer_shape() {
    let col = f32s(&[1.0, 2.0], &[2, 1]);
    let row = f32s(&[10.0, 20.0, 30.0], &[1, 3]);
    assert_array(
        &col.add(&row).unwrap(),
        &[2, 3],
        &[11.0, 21.0, 31.0, 12.0, 22.0, 32.0],
        0.0,
    );
    // A 0-d scalar broadcasts to anything.
    let s = Array::scalar(2.0, Dtype::Float32).unwrap();
    assert_array(&col.multiply(&s).unwrap(), &[2, 1], &[2.0, 4.0], 0.0);
}

#[test]
fn floor_divide_and_remainder_follow_the_sign_of_the_divisor() {
    let a = f32s(&[7.0, -7.0], &[2]);
    let b = f32s(&[2.0, 2.0], &[2]);
    assert_eq!(read_f32(&a.floor_divide(&b).unwrap()), vec![3.0, -4.0]);
    let three = f32s(&[3.0, 3.0], &[2]);
    assert_eq!(read_f32(&a.remainder(&three).unwrap()), vec![1.0, 2.0]);

    let ia = i32s(&[7, -7], &[2]);
    let ib = i32s(&[2, 2], &[2]);
    assert_eq!(
        ia.floor_divide(&ib).unwrap().to_vec::<i32>().unwrap(),
        vec![3, -4]
    );
    let i3 = i32s(&[3, 3], &[2]);
    assert_eq!(
        ia.remainder(&i3).unwrap().to_vec::<i32>().unwrap(),
        vec![1, 2]
    );
}

#[test]
fn power_maximum_and_minimum() {
    let a = f32s(&[2.0, 3.0, 4.0], &[3]);
    let b = f32s(&[3.0, 2.0, 0.5], &[3]);
    assert_close(&read_f32(&a.power(&b).unwrap()), &[8.0, 9.0, 2.0], 1e-6);
    assert_eq!(read_f32(&a.maximum(&b).unwrap()), vec![3.0, 3.0, 4.0]);
    assert_eq!(read_f32(&a.minimum(&b).unwrap()), vec![2.0, 2.0, 0.5]);
}

#[test]
fn comparisons_give_booleans_with_broadcasting() {
    let a = f32s(&[1.0, 2.0, 3.0], &[3]);
    let two = Array::scalar(2.0, Dtype::Float32).unwrap();
    assert_eq!(flags(&a.equal(&two).unwrap()), vec![false, true, false]);
    assert_eq!(flags(&a.not_equal(&two).unwrap()), vec![true, false, true]);
    assert_eq!(flags(&a.less(&two).unwrap()), vec![true, false, false]);
    assert_eq!(flags(&a.less_equal(&two).unwrap()), vec![true, true, false]);
    assert_eq!(flags(&a.greater(&two).unwrap()), vec![false, false, true]);
    assert_eq!(
        flags(&a.greater_equal(&two).unwrap()),
        vec![false, true, true]
    );
}

#[test]
fn logical_and_and_or_truth_tables() {
    let p = bools(&[true, true, false, false], &[4]);
    let q = bools(&[true, false, true, false], &[4]);
    assert_eq!(
        flags(&p.logical_and(&q).unwrap()),
        vec![true, false, false, false]
    );
    assert_eq!(
        flags(&p.logical_or(&q).unwrap()),
        vec![true, true, true, false]
    );
}

#[test]
fn integer_arithmetic_stays_integer() {
    let a = i32s(&[5, -3], &[2]);
    let b = i32s(&[2, 4], &[2]);
    let sum = a.add(&b).unwrap();
    assert_eq!(sum.dtype(), Dtype::Int32);
    assert_eq!(sum.to_vec::<i32>().unwrap(), vec![7, 1]);
    assert_eq!(
        a.multiply(&b).unwrap().to_vec::<i32>().unwrap(),
        vec![10, -12]
    );
}

#[test]
fn where_picks_from_x_or_y_with_broadcasting() {
    let cond = bools(&[true, false, false, true], &[2, 2]);
    let x = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let y = Array::scalar(-1.0, Dtype::Float32).unwrap();
    assert_array(
        &where_(&cond, &x, &y).unwrap(),
        &[2, 2],
        &[1.0, -1.0, -1.0, 4.0],
        0.0,
    );
}

#[test]
fn clip_with_either_or_both_bounds() {
    let x = f32s(&[-3.0, 0.5, 7.0], &[3]);
    let lo = Array::scalar(0.0, Dtype::Float32).unwrap();
    let hi = Array::scalar(1.0, Dtype::Float32).unwrap();
    assert_eq!(
        read_f32(&x.clip(Some(&lo), Some(&hi)).unwrap()),
        vec![0.0, 0.5, 1.0]
    );
    assert_eq!(
        read_f32(&x.clip(Some(&lo), None).unwrap()),
        vec![0.0, 0.5, 7.0]
    );
    assert_eq!(
        read_f32(&x.clip(None, Some(&hi)).unwrap()),
        vec![-3.0, 0.5, 1.0]
    );
    // Per-element bounds broadcast too.
    let los = f32s(&[-5.0, 1.0, 0.0], &[3]);
    assert_eq!(
        read_f32(&x.clip(Some(&los), None).unwrap()),
        vec![-3.0, 1.0, 7.0]
    );
}

#[test]
fn astype_truncates_floats_to_integers_and_maps_nonzero_to_true() {
    let x = f32s(&[1.7, -1.7, 0.0, 255.0], &[4]);
    assert_eq!(
        x.astype(Dtype::Int32).unwrap().to_vec::<i32>().unwrap(),
        vec![1, -1, 0, 255]
    );
    assert_eq!(
        x.astype(Dtype::Bool).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, false, true]
    );
    let b = bools(&[true, false], &[2]);
    assert_eq!(read_f32(&b.astype(Dtype::Float32).unwrap()), vec![1.0, 0.0]);
    let wide = i32s(&[3, -4], &[2]).astype(Dtype::Float64).unwrap();
    assert_eq!(wide.to_vec::<f64>().unwrap(), vec![3.0, -4.0]);
}
