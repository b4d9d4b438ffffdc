//! The gated MLP's `gelu_approx(gate) · up` on the CPU as one operation of
//! ours, on rayon's pool. MLX evaluates its compiled elementwise kernels on
//! its stream thread alone, one scalar `powf` and `tanhf` per value, which
//! took about a fifth of a prompt's time on the 2-core machine. Here
//! `0.5 · x · (1 + tanh(y))` is computed as `x / (1 + exp(−2y))`, the same
//! function with one `expf`, on both cores: within a few float32 roundings
//! of MLX's values (closer to the exact ones where MLX's `1 + tanh(y)`
//! cancels, for large negative `y`).

use std::sync::Arc;

use mlx_core::cpu_kernel::{cpu_kernel, floats, floats_mut, CpuKernelFn};
use mlx_core::{Array, Dtype};
use rayon::prelude::*;

/// Values handed to one rayon task at least.
const MIN_VALUES_PER_TASK: usize = 1024;

/// mlx's `gelu_approx` of `x` (`0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 ·
/// x³)))`) times `up`.
fn gated_gelu_value(x: f32, up: f32) -> f32 {
    let sqrt_2_over_pi = (2.0 / std::f64::consts::PI).sqrt() as f32;
    let y = (x + x * x * x * 0.044_715) * sqrt_2_over_pi;
    x / (1.0 + (-2.0 * y).exp()) * up
}

/// `gated_gelu_value` of each `gate` and `up` into `out`, on rayon's pool.
pub(crate) fn gated_gelu_into(gate: &[f32], up: &[f32], out: &mut [f32]) {
    out.par_chunks_mut(MIN_VALUES_PER_TASK)
        .zip(gate.par_chunks(MIN_VALUES_PER_TASK))
        .zip(up.par_chunks(MIN_VALUES_PER_TASK))
        .for_each(|((o, g), u)| {
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = gated_gelu_value(g, u);
            }
        });
}

/// `gelu_approx(gate) · up` for float32 `gate` and `up` of one shape, or
/// `None` for other dtypes or shapes (MLX's operations then serve).
pub(crate) fn gated_gelu(gate: &Array, up: &Array) -> mlx_core::Result<Option<Array>> {
    if gate.dtype() != Dtype::Float32 || up.dtype() != Dtype::Float32 || gate.shape() != up.shape()
    {
        return Ok(None);
    }
    let kernel: Arc<CpuKernelFn> = Arc::new(|inputs, out| {
        let [gate, up] = inputs else {
            return Err(format!(
                "the gated GELU takes 2 inputs, got {}",
                inputs.len()
            ));
        };
        let gate = floats(gate)?;
        let up = floats(up)?;
        let out = floats_mut(out)?;
        if gate.len() != out.len() || up.len() != out.len() {
            return Err("the gated GELU's inputs and output differ in size".into());
        }
        gated_gelu_into(gate, up, out);
        Ok(())
    });
    cpu_kernel(&[gate, up], &gate.shape(), Dtype::Float32, kernel).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gated_gelu_gives_mlx_s_values() {
        let n = 40_000;
        let gate: Vec<f32> = (0..n).map(|i| (i as f32 - 20_000.0) / 2_000.0).collect();
        let up: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 201) as f32 / 50.0 - 2.0)
            .collect();
        let (g, u) = (
            Array::from_slice(&gate, &[2, n / 2]).unwrap(),
            Array::from_slice(&up, &[2, n / 2]).unwrap(),
        );
        let ours = gated_gelu(&g, &u).unwrap().expect("float32 is taken");
        let ours = ours.to_vec::<f32>().unwrap();
        // MLX's operations, as the forward pass builds them.
        let c = |v: f64| Array::scalar(v, Dtype::Float32).unwrap();
        let inner = g
            .add(&g.power(&c(3.0)).unwrap().multiply(&c(0.044715)).unwrap())
            .unwrap()
            .multiply(&c((2.0 / std::f64::consts::PI).sqrt()))
            .unwrap();
        let mlx = g
            .multiply(&c(0.5))
            .unwrap()
            .multiply(&inner.tanh().unwrap().add(&c(1.0)).unwrap())
            .unwrap()
            .multiply(&u)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        // A few roundings of the value, or of MLX's `1 + tanh(y)` where it
        // cancels (an error of one rounding of 1, times x · up / 2).
        for (i, (a, b)) in ours.iter().zip(&mlx).enumerate() {
            let slack = (gate[i] * up[i]).abs() * f32::EPSILON;
            assert!(
                (a - b).abs() <= 4.0 * f32::EPSILON * b.abs() + slack,
                "gate {}, up {}: {a} against MLX's {b}",
                gate[i],
                up[i]
            );
        }
        let wide = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let half = wide.astype(Dtype::Float16).unwrap();
        assert!(gated_gelu(&half, &half).unwrap().is_none());
        let short = Array::from_slice(&[1.0f32], &[1]).unwrap();
        assert!(gated_gelu(&wide, &short).unwrap().is_none());
    }
}
