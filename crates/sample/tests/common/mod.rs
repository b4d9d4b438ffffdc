//! Helpers shared by the integration tests.

use mlx_core::Array;

/// A `[1, n]` float32 row.
pub fn row(values: &[f32]) -> Array {
    Array::from_slice(values, &[1, values.len() as i32]).expect("row array")
}
