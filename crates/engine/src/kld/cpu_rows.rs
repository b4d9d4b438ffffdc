//! The comparison's row operations on the CPU as operations of ours, on
//! rayon's pool: each row's log-sum-exp, its first largest value's index,
//! its KL divergence terms summed, and the elementwise `exp` of `[L, V]`
//! float32 arrays. MLX evaluates its own on its stream thread alone, one
//! vectorised `exp` of a single lane at a time (with `fmaf` as a library
//! call): on the default model those took about a third of a KLD sweep's
//! time while the other core waited, and its row argmax and sum another
//! 1.8 s of a 17.4 s sweep. Elsewhere (the GPU, other dtypes) MLX's
//! operations serve.

use std::sync::Arc;

use mlx_core::cpu_kernel::{cpu_kernel, floats, floats_mut, CpuKernelFn};
use mlx_core::device::default_device;
use mlx_core::{Array, Device, Dtype};
use rayon::prelude::*;

/// Values handed to one rayon task at least, for the elementwise `exp`.
const MIN_VALUES_PER_TASK: usize = 16 * 1024;

/// Whether operations now run on the CPU (MLX's default device).
fn on_cpu() -> mlx_core::Result<bool> {
    Ok(default_device()? == Device::Cpu)
}

/// `max + ln Σ exp(x − max)` of one row, the sum in float64; NaN where the
/// row holds a NaN or `+∞`, `−∞` where every value is `−∞`.
fn row_logsumexp(row: &[f32]) -> f32 {
    let (max, nan) = row_max(row);
    if nan || max == f32::INFINITY {
        return f32::NAN;
    }
    if max == f32::NEG_INFINITY {
        return max;
    }
    let sum: f64 = row.iter().map(|&x| f64::from((x - max).exp())).sum();
    max + (sum.ln() as f32)
}

/// The largest value of a row as `>` orders them (a NaN never wins; `−∞`
/// for an empty row or one of NaN), and whether the row holds a NaN: in 16
/// lanes, which the compiler turns into vector instructions (a running
/// maximum stays one dependent chain).
fn row_max(row: &[f32]) -> (f32, bool) {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut nans = [false; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for ((m, n), &v) in lanes.iter_mut().zip(nans.iter_mut()).zip(chunk) {
            *n |= v.is_nan();
            if v > *m {
                *m = v;
            }
        }
    }
    let mut max = lanes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
    let mut nan = nans.iter().any(|&n| n);
    for &v in rest {
        nan |= v.is_nan();
        if v > max {
            max = v;
        }
    }
    (max, nan)
}

/// One value per row of float32 `x` `[R, V]` (`V` > 0), `row` applied to
/// each row on rayon's pool, as an array of `dtype` shaped `[R]` followed
/// by `trailing` (`what` names the operation in errors); `None` off the
/// CPU or for other shapes and dtypes, where the caller's MLX operation
/// serves.
fn per_row<T: bytemuck::Pod + Send>(
    x: &Array,
    trailing: &[i32],
    dtype: Dtype,
    what: &'static str,
    row: fn(&[f32]) -> T,
) -> mlx_core::Result<Option<Array>> {
    let shape = x.shape();
    let [rows, width] = shape[..] else {
        return Ok(None);
    };
    if x.dtype() != Dtype::Float32 || width == 0 || !on_cpu()? {
        return Ok(None);
    }
    let width = width as usize;
    let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
        let [x] = inputs else {
            return Err(format!("{what} takes 1 input, got {}", inputs.len()));
        };
        let x = floats(x)?;
        let out: &mut [T] =
            bytemuck::try_cast_slice_mut(out).map_err(|e| format!("{what}'s output: {e}"))?;
        if x.len() != out.len() * width {
            return Err(format!("{what}'s input and output differ in rows"));
        }
        out.par_iter_mut()
            .zip(x.par_chunks(width))
            .for_each(|(o, values)| *o = row(values));
        Ok(())
    });
    let out_shape: Vec<i32> = std::iter::once(rows)
        .chain(trailing.iter().copied())
        .collect();
    cpu_kernel(&[x], &out_shape, dtype, kernel).map(Some)
}

/// Each row's log-sum-exp `[R, 1]` of `x` `[R, V]` (keeping the reduced axis,
/// as `x.logsumexp(&[-1], true)` does).
pub fn logsumexp_rows(x: &Array) -> mlx_core::Result<Array> {
    match per_row(
        x,
        &[1],
        Dtype::Float32,
        "the row log-sum-exp",
        row_logsumexp,
    )? {
        Some(lse) => Ok(lse),
        None => x.logsumexp(&[-1], true),
    }
}

/// Each row's index of its first largest value `[R]` (uint32) of `x` `[R,
/// V]`, as `x.argmax(-1, false)` gives it for rows without NaN (a row's
/// NaN is never picked here; such positions are left out of the
/// statistics anyway).
pub fn argmax_rows(x: &Array) -> mlx_core::Result<Array> {
    match per_row(x, &[], Dtype::Uint32, "the row argmax", row_argmax)? {
        Some(top) => Ok(top),
        None => x.argmax(-1, false),
    }
}

/// The index of the first largest value of a non-empty row, as a running
/// `v > best` comparison finds it (0 where the row starts with a NaN): the
/// row's maximum ([`row_max`]), then the first value equal to it.
fn row_argmax(row: &[f32]) -> u32 {
    if row.first().is_none_or(|v| v.is_nan()) {
        return 0;
    }
    let (max, _) = row_max(row);
    row.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// Each row's `Σ p · (lr − (z − lse))` `[R]`: the KL divergence of
/// reference probabilities `p` and log-probabilities `lr` against candidate
/// logits `z` whose row log-sum-exp is `lse` `[R, 1]` (all float32 `[R,
/// V]`), each term rounded in float32 as MLX's elementwise operations round
/// it and summed in float64, in one pass (no `[R, V]` array of terms);
/// `None` off the CPU or for other shapes and dtypes.
pub fn kl_rows(p: &Array, lr: &Array, z: &Array, lse: &Array) -> mlx_core::Result<Option<Array>> {
    let shape = z.shape();
    let [rows, width] = shape[..] else {
        return Ok(None);
    };
    let same_shapes = p.shape() == shape && lr.shape() == shape && lse.shape() == [rows, 1];
    let float32 = [p, lr, z, lse].iter().all(|a| a.dtype() == Dtype::Float32);
    if !same_shapes || !float32 || width == 0 || !on_cpu()? {
        return Ok(None);
    }
    let width = width as usize;
    let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
        let [p, lr, z, lse] = inputs else {
            return Err(format!("the KL rows take 4 inputs, got {}", inputs.len()));
        };
        let (p, lr, z, lse) = (floats(p)?, floats(lr)?, floats(z)?, floats(lse)?);
        let out = floats_mut(out)?;
        let rows = out.len();
        if [p.len(), lr.len(), z.len()]
            .iter()
            .any(|&n| n != rows * width)
            || lse.len() != rows
        {
            return Err("the KL rows' inputs differ in shape".into());
        }
        out.par_iter_mut().enumerate().for_each(|(r, o)| {
            let span = r * width..(r + 1) * width;
            let (p, lr, z) = (&p[span.clone()], &lr[span.clone()], &z[span]);
            let sum: f64 = p
                .iter()
                .zip(lr)
                .zip(z)
                .map(|((&p, &lr), &z)| f64::from(p * (lr - (z - lse[r]))))
                .sum();
            *o = sum as f32;
        });
        Ok(())
    });
    cpu_kernel(&[p, lr, z, lse], &[rows], Dtype::Float32, kernel).map(Some)
}

/// `exp` of every value of `x`.
pub fn exp(x: &Array) -> mlx_core::Result<Array> {
    if x.dtype() != Dtype::Float32 || !on_cpu()? {
        return x.exp();
    }
    let kernel: Arc<CpuKernelFn> = Arc::new(|inputs, out| {
        let [x] = inputs else {
            return Err(format!("exp takes 1 input, got {}", inputs.len()));
        };
        let (x, out) = (floats(x)?, floats_mut(out)?);
        if x.len() != out.len() {
            return Err("exp's input and output differ in size".into());
        }
        out.par_chunks_mut(MIN_VALUES_PER_TASK)
            .zip(x.par_chunks(MIN_VALUES_PER_TASK))
            .for_each(|(o, x)| {
                for (o, &x) in o.iter_mut().zip(x) {
                    *o = x.exp();
                }
            });
        Ok(())
    });
    cpu_kernel(&[x], &x.shape(), Dtype::Float32, kernel)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of every kind: wide and narrow values, a row of equal values,
    /// one with `−∞` entries, one all `−∞`, one with a NaN, one with `+∞`.
    fn rows() -> (Vec<f32>, usize) {
        let width = 1000;
        let mut x: Vec<f32> = (0..width * 3)
            .map(|i| ((i * 7919) % 2003) as f32 / 50.0 - 20.0)
            .collect();
        x.extend(std::iter::repeat_n(3.5, width));
        let mut with_neg_inf: Vec<f32> = (0..width).map(|i| i as f32 / 100.0).collect();
        with_neg_inf[..500].fill(f32::NEG_INFINITY);
        x.extend(with_neg_inf);
        x.extend(std::iter::repeat_n(f32::NEG_INFINITY, width));
        let mut with_nan = vec![1.0f32; width];
        with_nan[7] = f32::NAN;
        x.extend(with_nan);
        let mut with_inf = vec![1.0f32; width];
        with_inf[9] = f32::INFINITY;
        x.extend(with_inf);
        (x, width)
    }

    #[test]
    fn row_logsumexp_equals_a_float64_reference_and_mlx() {
        let (x, width) = rows();
        let n = x.len() / width;
        let array = Array::from_slice(&x, &[n as i32, width as i32]).unwrap();
        let ours = logsumexp_rows(&array).unwrap();
        assert_eq!(ours.shape(), vec![n as i32, 1]);
        let ours = ours.to_vec::<f32>().unwrap();
        let mlx = array
            .logsumexp(&[-1], true)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for (r, row) in x.chunks(width).enumerate().take(5) {
            let max = row
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, |m, v| m.max(v as f64));
            let exact = max
                + row
                    .iter()
                    .map(|&v| (v as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            assert!(
                (ours[r] as f64 - exact).abs() <= 1e-6 * exact.abs().max(1.0),
                "row {r}"
            );
            assert!(
                (ours[r] - mlx[r]).abs() <= 4e-6 * mlx[r].abs().max(1.0),
                "row {r}"
            );
        }
        assert_eq!(ours[3], 3.5 + (width as f32).ln());
        assert_eq!(ours[5], f32::NEG_INFINITY);
        assert!(ours[6].is_nan() && ours[7].is_nan());
    }

    #[test]
    fn row_argmax_picks_the_first_largest_value_as_mlx_does() {
        let (x, width) = rows();
        // The finite rows, the row of equal values and the one with −∞
        // entries (MLX's NaN and +∞ rows are left out of the statistics).
        let n = 5;
        let x = &x[..n * width];
        let array = Array::from_slice(x, &[n as i32, width as i32]).unwrap();
        let ours = argmax_rows(&array).unwrap();
        assert_eq!(ours.dtype(), Dtype::Uint32);
        let ours = ours.to_vec::<u32>().unwrap();
        let mlx = array.argmax(-1, false).unwrap().to_vec::<u32>().unwrap();
        assert_eq!(ours, mlx);
        assert_eq!(ours[3], 0, "the first of equal values");
        for (r, row) in x.chunks(width).enumerate() {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let first = row.iter().position(|&v| v == max).unwrap();
            assert_eq!(ours[r] as usize, first, "row {r}");
        }
    }

    #[test]
    fn the_lanes_find_what_a_running_comparison_finds() {
        let running = |row: &[f32]| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate().skip(1) {
                if v > row[best] {
                    best = i;
                }
            }
            best as u32
        };
        let nan = f32::NAN;
        let mut rows: Vec<Vec<f32>> = vec![
            vec![-0.0, 0.0],
            vec![0.0, -0.0],
            vec![nan, 5.0, 1.0],
            vec![1.0, nan, 5.0],
            vec![f32::NEG_INFINITY; 3],
            vec![2.0],
        ];
        // Lengths around the 16 lanes, the largest value in the lanes or
        // in the remainder, repeated, next to a NaN.
        for len in [15, 16, 17, 33, 40] {
            for at in [0, len / 2, len - 1] {
                let mut row: Vec<f32> = (0..len).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
                row[at] = 9.0;
                rows.push(row.clone());
                row[len - 1 - at] = 9.0;
                rows.push(row.clone());
                row[(at + 1) % len] = nan;
                rows.push(row);
            }
        }
        for row in &rows {
            assert_eq!(row_argmax(row), running(row), "{row:?}");
            let (max, has_nan) = row_max(row);
            assert_eq!(has_nan, row.iter().any(|v| v.is_nan()), "{row:?}");
            let expected = row
                .iter()
                .copied()
                .filter(|v| !v.is_nan())
                .fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max, expected, "{row:?}");
        }
    }

    #[test]
    fn kl_rows_equal_the_terms_summed_by_mlx_and_a_float64_reference() {
        let (x, width) = rows();
        let n = 3;
        let reference = Array::from_slice(&x[..n * width], &[n as i32, width as i32]).unwrap();
        // Candidate logits: the reference's, shifted and perturbed.
        let z: Vec<f32> = x[..n * width]
            .iter()
            .enumerate()
            .map(|(i, &v)| v + 0.3 + ((i * 31) % 17) as f32 / 40.0)
            .collect();
        let z = Array::from_slice(&z, &[n as i32, width as i32]).unwrap();
        let lr = reference
            .subtract(&logsumexp_rows(&reference).unwrap())
            .unwrap();
        let p = exp(&lr).unwrap();
        let lse = logsumexp_rows(&z).unwrap();
        let ours = kl_rows(&p, &lr, &z, &lse)
            .unwrap()
            .expect("the CPU's own operation")
            .to_vec::<f32>()
            .unwrap();
        let mlx = p
            .multiply(&lr.subtract(&z.subtract(&lse).unwrap()).unwrap())
            .unwrap()
            .sum(&[-1], false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let (pv, lrv) = (p.to_vec::<f32>().unwrap(), lr.to_vec::<f32>().unwrap());
        let (zv, lsev) = (z.to_vec::<f32>().unwrap(), lse.to_vec::<f32>().unwrap());
        for r in 0..n {
            let span = r * width..(r + 1) * width;
            let exact: f64 = span
                .map(|j| {
                    let lc = f64::from(zv[j]) - f64::from(lsev[r]);
                    f64::from(pv[j]) * (f64::from(lrv[j]) - lc)
                })
                .sum();
            assert!(exact > 1e-3, "row {r}: a KL of {exact} tests too little");
            assert!(
                (f64::from(ours[r]) - exact).abs() <= 1e-5 * exact,
                "row {r}: {} against {exact}",
                ours[r]
            );
            assert!(
                (ours[r] - mlx[r]).abs() <= 1e-5 * mlx[r],
                "row {r}: {} against MLX's {}",
                ours[r],
                mlx[r]
            );
        }
    }

    #[test]
    fn exp_equals_the_exponential_of_each_value() {
        let (x, width) = rows();
        let n = (x.len() / width) as i32;
        let array = Array::from_slice(&x, &[n, width as i32]).unwrap();
        let ours = exp(&array).unwrap().to_vec::<f32>().unwrap();
        let mlx = array.exp().unwrap().to_vec::<f32>().unwrap();
        for ((&v, &o), &m) in x.iter().zip(&ours).zip(&mlx) {
            let exact = (v as f64).exp();
            if v.is_nan() {
                assert!(o.is_nan());
            } else if v.is_infinite() {
                assert_eq!(o, m);
            } else {
                assert!((o as f64 - exact).abs() <= 2e-7 * exact, "exp({v}) = {o}");
                assert!((o - m).abs() <= 1e-6 * m, "exp({v}): ours {o}, MLX {m}");
            }
        }
    }
}
