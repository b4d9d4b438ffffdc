//! Helpers shared by the integration tests: building float arrays and
//! comparing them with hand-computed values.
//!
//! Each test binary uses only some of these helpers, so unused ones are
//! allowed here rather than flagged in every binary.
#![allow(dead_code)]

use mlx_core::Array;

/// A float32 array from host values (panics on a shape mismatch: test input).
pub fn f32s(data: &[f32], shape: &[i32]) -> Array {
    Array::from_slice(data, shape).unwrap()
}

/// An int32 array from host values.
pub fn i32s(data: &[i32], shape: &[i32]) -> Array {
    Array::from_slice(data, shape).unwrap()
}

/// A boolean array from host values.
pub fn bools(data: &[bool], shape: &[i32]) -> Array {
    Array::from_slice(data, shape).unwrap()
}

/// The float32 elements of `a`, row-major.
pub fn read_f32(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

/// Asserts `actual` and `expected` have the same length and differ by at
/// most `tol · max(1, |expected|)` element by element.
pub fn assert_close(actual: &[f32], expected: &[f32], tol: f32) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "lengths differ: {actual:?} vs {expected:?}"
    );
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let bound = tol * e.abs().max(1.0);
        assert!(
            (a - e).abs() <= bound,
            "element {i}: got {a}, expected {e} (tolerance {bound})\nactual:   {actual:?}\nexpected: {expected:?}"
        );
    }
}

/// Asserts the float32 contents and shape of `a`.
pub fn assert_array(a: &Array, shape: &[i32], expected: &[f32], tol: f32) {
    assert_eq!(a.shape(), shape, "shape");
    assert_close(&read_f32(a), expected, tol);
}
