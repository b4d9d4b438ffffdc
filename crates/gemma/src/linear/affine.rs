//! MLX affine-quantized matrices (4 or 8 bits, groups of 32, 64 or 128,
//! float32 scales and biases) multiplied on the CPU by our kernel of an x86
//! family ([`mlx_core::block_dot::affine_rows_dot`]) one row of activations
//! at a time, the activations quantized to 8 bits per 16 values as for GGUF
//! blocks; several rows (prefill) by MLX's matmul over the matrix
//! dequantized for that product. MLX's own CPU `quantized_matmul` is a
//! scalar loop.

use mlx_core::block_dot::{affine_rows_dot_available, CpuKernels};
use mlx_core::{Array, Dtype, QuantizedArray};

use super::rows::rows_product;
use super::tasks::affine_rows_times;

/// Whether `q`'s single-row products can run through our kernel of
/// `kernels`: its bits and group size have one in that family, and its
/// scales and biases are float32.
pub fn takes(q: &QuantizedArray, kernels: CpuKernels) -> mlx_core::Result<bool> {
    Ok(q.scales.dtype() == Dtype::Float32
        && q.biases.dtype() == Dtype::Float32
        && q.packed.ndim() == 2
        && affine_rows_dot_available(kernels, q.bits, q.group_size)?)
}

/// `x @ Wᵀ` in float32 for `x` `[..., cols]`: one row by our kernel of
/// `kernels`, several by MLX's matmul over the dequantized matrix.
pub fn times(q: &QuantizedArray, kernels: CpuKernels, x: &Array) -> mlx_core::Result<Array> {
    let cols = q.packed.dim(1)? * 32 / q.bits.max(1);
    if x.dim(-1)? != cols {
        return Err(mlx_core::Error::Host(format!(
            "a {}-bit matrix of {cols} columns times inputs of {}",
            q.bits,
            x.dim(-1)?
        )));
    }
    let inputs = x.size() / cols.max(1) as usize;
    if inputs != 1 {
        return x.linear(&q.dequantize()?);
    }
    let (bits, group_size) = (q.bits, q.group_size);
    let arrays = [&q.packed, &q.scales, &q.biases];
    rows_product(&arrays, x, q.packed.dim(0)?, move |w, x, y| {
        let [packed, scales, biases] = w else {
            return Err(format!(
                "the affine product takes 3 arrays, got {}",
                w.len()
            ));
        };
        affine_rows_times(kernels, packed, scales, biases, (bits, group_size), x, y)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Int8Row;
    use mlx_core::quantize;

    /// Products of `bits`-bit rows in groups of `group` with one and with
    /// three rows of activations, against the f64 sums of the dequantized
    /// rows' products with the activations the kernel sees (one row: the
    /// 8-bit activations' values; several: the float32 ones), within float
    /// tolerance.
    fn check(kernels: CpuKernels, bits: i32, group: i32) {
        let (rows, cols) = (37usize, 256usize);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 + 13) % 2003) as f32 / 1000.0 - 1.0)
            .collect();
        let q = quantize(&Array::from_slice(&w, &[37, 256]).unwrap(), group, bits).unwrap();
        assert!(
            takes(&q, kernels).unwrap(),
            "{kernels}: {bits} bits, group {group}"
        );
        let dense = q.dequantize().unwrap().to_vec::<f32>().unwrap();
        for inputs in [1usize, 3] {
            let x: Vec<f32> = (0..inputs * cols)
                .map(|i| ((i * 104_729) % 1999) as f32 / 999.0 - 0.9)
                .collect();
            let xa = Array::from_slice(&x, &[1, inputs as i32, cols as i32]).unwrap();
            let y = times(&q, kernels, &xa).unwrap().to_vec::<f32>().unwrap();
            for m in 0..inputs {
                let mut xs = x[m * cols..(m + 1) * cols].to_vec();
                if inputs == 1 {
                    let row = Int8Row::new(&xs);
                    let a = row.as_activations();
                    for (j, v) in xs.iter_mut().enumerate() {
                        *v = a.scales[j / 16] * f32::from(a.q[j]);
                    }
                }
                for r in 0..rows {
                    let row = &dense[r * cols..(r + 1) * cols];
                    let exact: f64 = row
                        .iter()
                        .zip(&xs)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    let scale: f64 = row
                        .iter()
                        .zip(&xs)
                        .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                        .sum();
                    let got = f64::from(y[m * rows + r]);
                    assert!(
                        (got - exact).abs() <= 1e-5 * scale,
                        "{kernels}: {bits} bits, group {group}, {inputs} inputs: row {r}: \
                         {got} against {exact}"
                    );
                }
            }
        }
    }

    #[test]
    fn affine_rows_multiply_as_their_dequantized_values() {
        let mut checked = 0;
        for kernels in CpuKernels::supported().unwrap() {
            if !affine_rows_dot_available(kernels, 4, 64).unwrap() {
                continue;
            }
            for bits in [4, 8] {
                for group in [32, 64, 128] {
                    check(kernels, bits, group);
                }
            }
            checked += 1;
        }
        if checked == 0 {
            println!("SKIPPED: no affine kernel on this CPU");
        }
    }

    #[test]
    fn other_widths_float16_scales_and_the_portable_family_are_not_taken() {
        let best = CpuKernels::best().unwrap();
        let w = Array::from_slice(&[0.5f32; 4 * 64], &[4, 64]).unwrap();
        let q = quantize(&w, 64, 2).unwrap();
        assert!(!takes(&q, best).unwrap());
        let mut q = quantize(&w, 64, 4).unwrap();
        assert!(!takes(&q, CpuKernels::Portable).unwrap());
        q.scales = q.scales.astype(Dtype::Float16).unwrap();
        assert!(!takes(&q, best).unwrap());
    }
}
