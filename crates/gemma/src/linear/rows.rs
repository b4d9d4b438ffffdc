//! Products of rows of activations with a matrix held in arrays of any
//! layout, as one MLX operation whose CPU kernel is a closure of ours.

use std::sync::Arc;

use mlx_core::cpu_kernel::{cpu_kernel, floats, floats_mut, CpuKernelFn};
use mlx_core::{Array, Dtype};

/// `x @ Wᵀ` in float32 for rows of activations `x` `[..., cols]` against a
/// matrix of `rows` rows held in the arrays `weights`: an operation whose CPU
/// kernel hands `product` the weights' bytes (in order) and the rows'
/// values, and takes the `rows` products of each from it.
pub(crate) fn rows_product(
    weights: &[&Array],
    x: &Array,
    rows: i32,
    product: impl Fn(&[&[u8]], &[f32], &mut [f32]) -> Result<(), String> + Send + Sync + 'static,
) -> mlx_core::Result<Array> {
    let x = if x.dtype() == Dtype::Float32 {
        x.clone()
    } else {
        x.astype(Dtype::Float32)?
    };
    let mut shape = x.shape();
    if let Some(last) = shape.last_mut() {
        *last = rows;
    }
    let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
        let Some((xb, w)) = inputs.split_last() else {
            return Err("a row product without inputs".into());
        };
        let x = floats(xb)?;
        let y = floats_mut(out)?;
        product(w, x, y)
    });
    let mut inputs = weights.to_vec();
    inputs.push(&x);
    cpu_kernel(&inputs, &shape, Dtype::Float32, kernel)
}
