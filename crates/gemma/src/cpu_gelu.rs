//! The gated MLP's `gelu_approx(gate) · up` on the CPU as one operation of
//! ours, on rayon's pool. MLX evaluates its compiled elementwise kernels on
//! its stream thread alone, one scalar `powf` and `tanhf` per value, which
//! took about a fifth of a prompt's time on the 2-core machine; this computes
//! the same operations in the same order (so the same float32 values) on
//! both cores.

use std::sync::Arc;

use mlx_core::cpu_kernel::{cpu_kernel, CpuKernelFn};
use mlx_core::{Array, Dtype};
use rayon::prelude::*;

/// Values handed to one rayon task at least.
const MIN_VALUES_PER_TASK: usize = 16 * 1024;

/// mlx's `gelu_approx` of `x` times `up`, as MLX's compiled kernel computes
/// `x · 0.5 · (tanh(√(2/π) · (x + x³ · 0.044715)) + 1) · up`.
pub(crate) fn gated_gelu_value(x: f32, up: f32) -> f32 {
    let sqrt_2_over_pi = (2.0 / std::f64::consts::PI).sqrt() as f32;
    let inner = (x + x.powf(3.0) * 0.044_715) * sqrt_2_over_pi;
    x * 0.5 * (inner.tanh() + 1.0) * up
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
        let gate: &[f32] = bytemuck::try_cast_slice(gate).map_err(|e| e.to_string())?;
        let up: &[f32] = bytemuck::try_cast_slice(up).map_err(|e| e.to_string())?;
        let out: &mut [f32] = bytemuck::try_cast_slice_mut(out).map_err(|e| e.to_string())?;
        if gate.len() != out.len() || up.len() != out.len() {
            return Err("the gated GELU's inputs and output differ in size".into());
        }
        out.par_chunks_mut(MIN_VALUES_PER_TASK)
            .zip(gate.par_chunks(MIN_VALUES_PER_TASK))
            .zip(up.par_chunks(MIN_VALUES_PER_TASK))
            .for_each(|((o, g), u)| {
                for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                    *o = gated_gelu_value(g, u);
                }
            });
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
            Array::from_slice(&gate, &[2, n as i32 / 2]).unwrap(),
            Array::from_slice(&up, &[2, n as i32 / 2]).unwrap(),
        );
        let ours = gated_gelu(&g, &u).unwrap().expect("float32 is taken");
        let ours = ours.to_vec::<f32>().unwrap();
        // MLX's operations, as model.rs builds them.
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
        for (i, (a, b)) in ours.iter().zip(&mlx).enumerate() {
            assert!(
                (a - b).abs() <= 2.0 * f32::EPSILON * b.abs().max(1e-30),
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
