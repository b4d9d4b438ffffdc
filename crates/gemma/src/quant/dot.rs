//! Products of GGUF block-quantized rows with vectors, reading the blocks as
//! stored: each block is decoded into registers as small integers with a
//! scale (and offset) per 16 values ([`super::blocks`], the decoders
//! [`super::dequantize`] uses, so the weights are exactly ggml's) and never
//! written out. The activations enter in float32 ([`Activations::F32`], the
//! exact path) or quantized to 8 bits per group of 16 values
//! ([`Activations::Int8`], as llama.cpp does per block), the integers then
//! multiplied as integers. Rows run in parallel. With 8-bit activations,
//! `mlx-c`'s x86 kernels ([`mlx_core::block_dot`]) of the family the
//! product names ([`Arithmetic::kernels`]) take the types they cover; the
//! Rust kernels here take the rest, and every type in the portable family
//! (an AVX2 build of their inner loop picked at run time where the CPU has
//! it: the same sums, faster).

use mlx_core::block_dot::{block_rows_dot, block_rows_dot_available, CpuKernels, Int8Activations};
use multiversion::multiversion;
use rayon::prelude::*;

use super::blocks::{self, Format, GROUP};
use super::dequant::DequantError;
use super::dtype::GgufDtype;

/// Bytes of the matrix handed to one rayon task at least: a task's rows take
/// several microseconds, so that scheduling them does not cost more than
/// the products.
pub(crate) const MIN_BYTES_PER_TASK: usize = 64 * 1024;

/// Tasks per thread a single row's product over a large matrix (the
/// logits) is split into: enough to even out the threads, few enough that
/// each task's setup in `mlx-c` (the activations laid out for the kernel)
/// is paid a handful of times per token rather than once per 64 KB.
const TASKS_PER_THREAD: usize = 4;

/// Rows of activations a task of a multi-row product takes at least: each
/// task decodes the whole matrix once, which costs about as much as
/// multiplying it with a few rows.
const MIN_INPUTS_PER_TASK: usize = 16;

/// Weight rows `mlx-c`'s widest multi-row kernel decodes at a time: tasks
/// of a split matrix take whole multiples of it.
const ROWS_PER_TILE_BLOCK: usize = 16;

/// Bytes of the matrix a task of a short prompt's product takes at least:
/// 16 rows of activations against a 112 KB matrix took 70 µs on one core
/// and 98 µs split over two (waking the second thread costs more than it
/// saves); 370 KB to 900 KB matrices were 16–35 % faster split.
const MIN_BYTES_PER_ROWS_TASK: usize = 128 * 1024;

/// How activations enter a product with block-quantized rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Activations {
    /// Float32, multiplied with each block's integers in float32: the sum of
    /// the dequantized products, in another order.
    F32,
    /// Quantized to signed 8 bits with one float scale per 16 values (the
    /// weights' groups; llama.cpp takes one per block of 32 or 256),
    /// products summed as integers.
    #[default]
    Int8,
}

impl Activations {
    /// The name `gemma-mlx` reports: `int8` or `f32`.
    pub fn name(self) -> &'static str {
        match self {
            Activations::F32 => "f32",
            Activations::Int8 => "int8",
        }
    }
}

/// How a product with block-quantized rows computes: how its activations
/// enter, and which family of CPU kernels multiplies 8-bit ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arithmetic {
    /// How activations enter.
    pub activations: Activations,
    /// The kernel family for 8-bit activations (float32 ones always take
    /// the portable Rust kernels).
    pub kernels: CpuKernels,
}

impl Arithmetic {
    /// 8-bit activations on the kernels of `kernels`.
    pub fn int8(kernels: CpuKernels) -> Arithmetic {
        Arithmetic {
            activations: Activations::Int8,
            kernels,
        }
    }

    /// Float32 activations: the exact path, on the portable kernels.
    pub fn f32() -> Arithmetic {
        Arithmetic {
            activations: Activations::F32,
            kernels: CpuKernels::Portable,
        }
    }

    /// The family whose kernels compute the products: [`Arithmetic::kernels`]
    /// for 8-bit activations, the portable one for float32.
    pub fn effective_kernels(self) -> CpuKernels {
        match self.activations {
            Activations::Int8 => self.kernels,
            Activations::F32 => CpuKernels::Portable,
        }
    }
}

/// Whether rows of `dtype` can be multiplied as stored.
pub fn can_multiply(dtype: GgufDtype) -> bool {
    use GgufDtype::*;
    matches!(
        dtype,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K
    )
}

/// `out[m · rows + r] = Σ_j w[r, j] · x[m · cols + j]`: every row `r` of the
/// matrix `w` (`rows` rows of `cols` values of `dtype`, whole blocks each)
/// against every row `m` of `x`, computed as `arithmetic` says (an error
/// for a kernel family this CPU does not run).
pub fn rows_times(
    dtype: GgufDtype,
    w: &[u8],
    cols: usize,
    x: &[f32],
    out: &mut [f32],
    arithmetic: Arithmetic,
) -> Result<(), DequantError> {
    let Arithmetic {
        activations,
        kernels,
    } = arithmetic;
    use GgufDtype::*;
    let block = dtype.block_size() as usize;
    let type_size = dtype.type_size() as usize;
    let row_bytes = cols / block.max(1) * type_size;
    let fits = can_multiply(dtype)
        && cols > 0
        && cols.is_multiple_of(block)
        && w.len().is_multiple_of(row_bytes.max(1))
        && x.len().is_multiple_of(cols)
        && out.len() == (w.len() / row_bytes.max(1)) * (x.len() / cols);
    if !fits {
        return Err(DequantError::PartialBlock {
            dtype,
            len: w.len(),
            type_size: type_size as u64,
        });
    }
    if out.is_empty() {
        // No rows of activations (or of the matrix): nothing to multiply.
        return Ok(());
    }
    let product = Product {
        w,
        row_bytes,
        x,
        cols,
        activations,
    };
    if activations == Activations::Int8 && block_rows_dot_available(kernels, dtype.id())? {
        return product.run_native(kernels, dtype, out);
    }
    match dtype {
        Q4_0 => product.run(out, blocks::Q4_0),
        Q4_1 => product.run(out, blocks::Q4_1),
        Q5_0 => product.run(out, blocks::Q5_0),
        Q5_1 => product.run(out, blocks::Q5_1),
        Q8_0 => product.run(out, blocks::Q8_0),
        Q2_K => product.run(out, blocks::Q2_K),
        Q3_K => product.run(out, blocks::Q3_K),
        Q4_K => product.run(out, blocks::Q4_K),
        Q5_K => product.run(out, blocks::Q5_K),
        Q6_K => product.run(out, blocks::Q6_K),
        other => return Err(DequantError::Unsupported(other)),
    }
    Ok(())
}

/// One row of activations prepared for a product: its values in groups of
/// 16 (float32, or 8-bit integers with one scale per group) and each
/// group's sum (needed by formats with an offset).
enum Prepared {
    /// Float32 values.
    Float {
        groups: Vec<[f32; GROUP]>,
        sums: Vec<f32>,
    },
    /// 8-bit values.
    Int(Int8Row),
}

/// Rows of activations quantized to 8 bits per group of 16 (one row while
/// decoding).
pub(crate) struct Int8Row {
    /// The integers, value ≈ `scales[g]` · q.
    groups: Vec<[i8; GROUP]>,
    /// Each group's scale: its largest magnitude over 127.
    scales: Vec<f32>,
    /// Each group's sum of its approximations.
    sums: Vec<f32>,
}

impl Int8Row {
    /// `x` (whole groups of 16), each group rounded to the nearest multiple
    /// of its scale.
    pub(crate) fn new(x: &[f32]) -> Int8Row {
        let groups = x.len() / GROUP;
        let mut row = Int8Row {
            groups: vec![[0; GROUP]; groups],
            scales: vec![0.0; groups],
            sums: vec![0.0; groups],
        };
        quantize_groups(x, &mut row.groups, &mut row.scales, &mut row.sums);
        row
    }

    /// The row as `mlx-c`'s kernels take it.
    pub(crate) fn as_activations(&self) -> Int8Activations<'_> {
        Int8Activations {
            q: self.groups.as_flattened(),
            scales: &self.scales,
            sums: &self.sums,
        }
    }
}

/// Each group of 16 values of `x` rounded to the nearest multiple of its
/// scale (its largest magnitude over 127), with the scales and the sums of
/// the approximations; built for AVX2 where the CPU has it, so that the
/// rounding is inlined rather than a call per value.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
fn quantize_groups(x: &[f32], groups: &mut [[i8; GROUP]], scales: &mut [f32], sums: &mut [f32]) {
    for (((values, q), scale), sum) in x
        .chunks_exact(GROUP)
        .zip(groups.iter_mut())
        .zip(scales.iter_mut())
        .zip(sums.iter_mut())
    {
        *scale = values.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        let inverse = if *scale > 0.0 { 1.0 / *scale } else { 0.0 };
        for (q, v) in q.iter_mut().zip(values) {
            *q = (v * inverse).round() as i8;
        }
        *sum = q.iter().map(|&v| i32::from(v)).sum::<i32>() as f32 * *scale;
    }
}

impl Prepared {
    /// `x` (whole groups of 16) as `activations` asks.
    fn new(x: &[f32], activations: Activations) -> Prepared {
        match activations {
            Activations::F32 => Prepared::Float {
                groups: x
                    .chunks_exact(GROUP)
                    .map(|g| {
                        let mut group = [0f32; GROUP];
                        group.copy_from_slice(g);
                        group
                    })
                    .collect(),
                sums: x.chunks_exact(GROUP).map(|g| g.iter().sum()).collect(),
            },
            Activations::Int8 => Prepared::Int(Int8Row::new(x)),
        }
    }
}

/// A product's operands, before the block type is known.
struct Product<'a> {
    w: &'a [u8],
    row_bytes: usize,
    x: &'a [f32],
    cols: usize,
    activations: Activations,
}

impl Product<'_> {
    /// Rows per rayon task: at least [`MIN_BYTES_PER_TASK`] of the matrix.
    fn rows_per_task(&self) -> usize {
        (MIN_BYTES_PER_TASK / self.row_bytes).max(1)
    }

    /// The product with 8-bit activations by `mlx-c`'s kernel for `dtype`
    /// in `family`. One row of `x` runs against tasks of the matrix's rows
    /// in parallel; several rows run in tasks of rows of `x`, each
    /// quantizing its rows and taking the whole matrix (which the kernel
    /// decodes once per tile for all of them).
    fn run_native(
        &self,
        family: CpuKernels,
        dtype: GgufDtype,
        out: &mut [f32],
    ) -> Result<(), DequantError> {
        let rows = self.w.len() / self.row_bytes;
        let inputs = self.x.len() / self.cols;
        if inputs == 1 {
            let row = Int8Row::new(self.x);
            let x = row.as_activations();
            let rows_per_task = self
                .rows_per_task()
                .max(rows.div_ceil(TASKS_PER_THREAD * rayon::current_num_threads()));
            return Ok(out
                .par_chunks_mut(rows_per_task)
                .zip(self.w.par_chunks(rows_per_task * self.row_bytes))
                .try_for_each(|(o, w)| {
                    block_rows_dot(family, dtype.id(), w, self.row_bytes, x, o)
                })?);
        }
        let threads = rayon::current_num_threads();
        if inputs < MIN_INPUTS_PER_TASK * threads {
            return self.run_native_by_rows(family, dtype, inputs, out);
        }
        let per_task = inputs.div_ceil(2 * threads).max(MIN_INPUTS_PER_TASK);
        Ok(out
            .par_chunks_mut(per_task * rows)
            .zip(self.x.par_chunks(per_task * self.cols))
            .try_for_each(|(o, xs)| {
                let x = Int8Row::new(xs);
                let x = x.as_activations();
                block_rows_dot(family, dtype.id(), self.w, self.row_bytes, x, o)
            })?)
    }

    /// [`Product::run_native`] for fewer rows of `x` than would give every
    /// thread a task of [`MIN_INPUTS_PER_TASK`] (a short prompt): the
    /// activations quantized once and the matrix's rows split into one task
    /// per thread, each multiplying its rows with every row of `x` (split
    /// by activation rows, 16 tokens had run on one core).
    fn run_native_by_rows(
        &self,
        family: CpuKernels,
        dtype: GgufDtype,
        inputs: usize,
        out: &mut [f32],
    ) -> Result<(), DequantError> {
        let rows = self.w.len() / self.row_bytes;
        let x = Int8Row::new(self.x);
        let x = x.as_activations();
        let tasks = (self.w.len() / MIN_BYTES_PER_ROWS_TASK).clamp(1, rayon::current_num_threads());
        let rows_per_task = rows.div_ceil(tasks).next_multiple_of(ROWS_PER_TILE_BLOCK);
        let parts: Vec<(usize, Vec<f32>)> = self
            .w
            .par_chunks(rows_per_task * self.row_bytes)
            .enumerate()
            .map(|(task, w)| {
                let mut part = vec![0f32; w.len() / self.row_bytes * inputs];
                block_rows_dot(family, dtype.id(), w, self.row_bytes, x, &mut part)
                    .map(|()| (task * rows_per_task, part))
            })
            .collect::<Result<_, _>>()?;
        for (first, part) in parts {
            let width = part.len() / inputs;
            for (input, values) in part.chunks_exact(width).enumerate() {
                out[input * rows + first..][..width].copy_from_slice(values);
            }
        }
        Ok(())
    }

    /// The product for blocks of `format`: the matrix's rows in parallel,
    /// each against every row of `x`.
    fn run<const N: usize, const G: usize, F: Format<N, G>>(&self, out: &mut [f32], format: F) {
        let prepared: Vec<Prepared> = self
            .x
            .chunks_exact(self.cols)
            .map(|xs| Prepared::new(xs, self.activations))
            .collect();
        let dot = |row: &[u8], p: &Prepared| match p {
            Prepared::Float { groups, sums } => float_row_dot(row, groups, sums, format),
            Prepared::Int(x) => int_row_dot(row, &x.groups, &x.scales, &x.sums, format),
        };
        let rows = self.w.len() / self.row_bytes;
        let rows_per_task = self.rows_per_task();
        if let [p] = prepared.as_slice() {
            out.par_iter_mut()
                .zip(self.w.par_chunks(self.row_bytes))
                .with_min_len(rows_per_task)
                .for_each(|(o, row)| *o = dot(row, p));
            return;
        }
        let inputs = prepared.len();
        let mut products = vec![0f32; rows * inputs];
        products
            .par_chunks_mut(inputs)
            .zip(self.w.par_chunks(self.row_bytes))
            .with_min_len(rows_per_task)
            .for_each(|(dots, row)| {
                for (d, p) in dots.iter_mut().zip(&prepared) {
                    *d = dot(row, p);
                }
            });
        // `products` is row-major by matrix row; the output by input row.
        for (r, dots) in products.chunks_exact(inputs).enumerate() {
            for (m, &d) in dots.iter().enumerate() {
                out[m * rows + r] = d;
            }
        }
    }
}

/// One row of blocks dotted with float32 activations `x` (16 values a
/// group) whose group sums are `sums`: per group, scale · Σ q·x (+ offset ·
/// Σ x), in eight running lanes.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
fn float_row_dot<const N: usize, const G: usize, F: Format<N, G>>(
    row: &[u8],
    x: &[[f32; GROUP]],
    sums: &[f32],
    _format: F,
) -> f32 {
    let mut lanes = [0f32; 8];
    let mut offsets = 0f32;
    for ((block, xs), sums) in row
        .chunks_exact(N)
        .zip(x.chunks_exact(G))
        .zip(sums.chunks_exact(G))
    {
        let Ok(block) = block.try_into() else {
            continue;
        };
        let ints = F::decode(block);
        for ((q, x), &scale) in ints.q.iter().zip(xs).zip(&ints.scales) {
            for l in 0..8 {
                let pair = f32::from(q[2 * l]) * x[2 * l] + f32::from(q[2 * l + 1]) * x[2 * l + 1];
                lanes[l] += scale * pair;
            }
        }
        if let Some(o) = &ints.offsets {
            offsets += o.iter().zip(sums).map(|(o, s)| o * s).sum::<f32>();
        }
    }
    lanes.iter().sum::<f32>() + offsets
}

/// One row of blocks dotted with 8-bit activations `x` (16 values a group,
/// `scales[g]` for group `g`, group sums `sums`): per group, the integer
/// Σ q·x, scaled by the weights' and the activations' scales, in two
/// alternating sets of eight running lanes.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
fn int_row_dot<const N: usize, const G: usize, F: Format<N, G>>(
    row: &[u8],
    x: &[[i8; GROUP]],
    scales: &[f32],
    sums: &[f32],
    _format: F,
) -> f32 {
    let mut lanes = [[0f32; 8]; 2];
    let mut offsets = 0f32;
    for (((block, xs), x_scales), sums) in row
        .chunks_exact(N)
        .zip(x.chunks_exact(G))
        .zip(scales.chunks_exact(G))
        .zip(sums.chunks_exact(G))
    {
        let Ok(block) = block.try_into() else {
            continue;
        };
        let ints = F::decode(block);
        for (g, (((q, x), &scale), &x_scale)) in ints
            .q
            .iter()
            .zip(xs)
            .zip(&ints.scales)
            .zip(x_scales)
            .enumerate()
        {
            let mut pairs = [0i32; 8];
            for (l, p) in pairs.iter_mut().enumerate() {
                *p = i32::from(q[2 * l]) * i32::from(x[2 * l])
                    + i32::from(q[2 * l + 1]) * i32::from(x[2 * l + 1]);
            }
            let scale = scale * x_scale;
            let lanes = &mut lanes[g % 2];
            for l in 0..8 {
                lanes[l] += scale * pairs[l] as f32;
            }
        }
        if let Some(o) = &ints.offsets {
            offsets += o.iter().zip(sums).map(|(o, s)| o * s).sum::<f32>();
        }
    }
    lanes.iter().flatten().sum::<f32>() + offsets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize;

    /// Random blocks of `dtype` whose f16 fields are finite: bytes from a
    /// small generator, every f16 field overwritten with 0.0123 or -0.0456.
    fn blocks(dtype: GgufDtype, n_blocks: usize, seed: u64) -> Vec<u8> {
        let mut state = seed;
        let size = dtype.type_size() as usize;
        let mut bytes: Vec<u8> = (0..n_blocks * size)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) as u8
            })
            .collect();
        use GgufDtype::*;
        // Byte offsets of the f16 fields within a block.
        let halves: &[usize] = match dtype {
            Q4_0 | Q5_0 | Q8_0 => &[0],
            Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
            Q2_K => &[80, 82],
            Q3_K => &[108],
            Q6_K => &[208],
            _ => &[],
        };
        for (i, block) in bytes.chunks_exact_mut(size).enumerate() {
            for &at in halves {
                let v = if (i + at) % 2 == 0 {
                    0.0123f32
                } else {
                    -0.0456
                };
                block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
        bytes
    }

    /// The products of `dtype` rows with `x` as `arithmetic` says, against
    /// the f64 sums of the dequantized rows' products: within
    /// `f32_tolerance` of Σ |w·x| for float32 activations; for 8-bit ones,
    /// within the largest error their rounding allows (each value off by at
    /// most half its group's step, amax/254 over 16 values) plus the same
    /// float tolerance.
    fn check_products(dtype: GgufDtype, arithmetic: Arithmetic) {
        let activations = arithmetic.activations;
        let f32_tolerance = 1e-6;
        for (rows, cols, inputs) in [(37, 512, 3), (5, 256, 1)] {
            let blocks_per_row = cols / dtype.block_size() as usize;
            let w = blocks(dtype, rows * blocks_per_row, dtype.id() as u64 + 7);
            let x: Vec<f32> = (0..inputs * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut ours = vec![0f32; rows * inputs];
            rows_times(dtype, &w, cols, &x, &mut ours, arithmetic).unwrap();
            let dense = dequantize(dtype, &w).unwrap();
            for m in 0..inputs {
                for r in 0..rows {
                    let row = &dense[r * cols..(r + 1) * cols];
                    let xs = &x[m * cols..(m + 1) * cols];
                    let exact: f64 = row
                        .iter()
                        .zip(xs)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    let scale: f64 = row
                        .iter()
                        .zip(xs)
                        .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                        .sum();
                    let rounding: f64 = match activations {
                        Activations::F32 => 0.0,
                        Activations::Int8 => row
                            .chunks_exact(16)
                            .zip(xs.chunks_exact(16))
                            .map(|(w, x)| {
                                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                                let w_abs: f64 = w.iter().map(|v| f64::from(v.abs())).sum();
                                w_abs * f64::from(amax) / 254.0
                            })
                            .sum(),
                    };
                    let got = f64::from(ours[m * rows + r]);
                    assert!(
                        (got - exact).abs() <= rounding * 1.0001 + f32_tolerance * scale.max(1e-30),
                        "{dtype} {arithmetic:?}: row {r}, input {m}: {got} against {exact}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_block_type_multiplies_float_activations_as_its_dequantized_rows_do() {
        use GgufDtype::*;
        for dtype in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K] {
            check_products(dtype, Arithmetic::f32());
        }
    }

    #[test]
    fn every_block_type_multiplies_8_bit_activations_within_their_rounding() {
        use GgufDtype::*;
        for family in CpuKernels::supported().unwrap() {
            for dtype in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K] {
                check_products(dtype, Arithmetic::int8(family));
            }
        }
    }

    #[test]
    fn each_family_has_the_kernels_it_names() {
        use GgufDtype::*;
        let covered = [Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K];
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c");
            let avx512 = avx2
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("avx512vnni");
            assert_eq!(CpuKernels::Avx2.is_supported().unwrap(), avx2);
            assert_eq!(CpuKernels::Avx512.is_supported().unwrap(), avx512);
        }
        assert!(CpuKernels::Portable.is_supported().unwrap());
        for family in CpuKernels::supported().unwrap() {
            for dtype in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K] {
                let has = family != CpuKernels::Portable && covered.contains(&dtype);
                assert_eq!(
                    block_rows_dot_available(family, dtype.id()).unwrap(),
                    has,
                    "{family}, {dtype}"
                );
            }
        }
        for family in CpuKernels::ALL {
            if !family.is_supported().unwrap() {
                let refused = block_rows_dot_available(family, Q8_0.id()).unwrap_err();
                assert!(
                    refused.to_string().contains("do not run on this CPU"),
                    "{refused}"
                );
            }
        }
    }

    #[test]
    fn mlx_c_kernels_sum_as_the_rust_kernels_do() {
        use GgufDtype::*;
        let covered = [Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K];
        // Each family against the portable Rust kernels: the same integer
        // sums per group, only the order of the float additions differs. An
        // odd number of blocks as well (the 512-bit kernels take two blocks
        // of 32 values at a time), and from 1 to 37 rows of activations
        // (from 4 rows a task, `mlx-c` decodes tiles of 4 weight rows and
        // multiplies them in pairs of rows).
        let families = CpuKernels::supported().unwrap();
        let shapes = covered.iter().flat_map(|&dtype| {
            [1024, 1024 + dtype.block_size() as usize]
                .into_iter()
                .flat_map(move |cols| [1, 2, 7, 37].map(|inputs| (dtype, cols, inputs)))
        });
        for (dtype, cols, inputs) in shapes {
            let rows = 37;
            let w = blocks(dtype, rows * cols / dtype.block_size() as usize, 11);
            let x: Vec<f32> = (0..inputs * cols)
                .map(|i| ((i * 7919) % 1013) as f32 / 500.0 - 1.0)
                .collect();
            let mut portable = vec![0f32; rows * inputs];
            let reference = Arithmetic::int8(CpuKernels::Portable);
            rows_times(dtype, &w, cols, &x, &mut portable, reference).unwrap();
            let dense = dequantize(dtype, &w).unwrap();
            for &family in families.iter().filter(|&&f| f != CpuKernels::Portable) {
                let mut ours = vec![0f32; rows * inputs];
                rows_times(dtype, &w, cols, &x, &mut ours, Arithmetic::int8(family)).unwrap();
                for (i, (f, p)) in ours.iter().zip(&portable).enumerate() {
                    let (m, r) = (i / rows, i % rows);
                    let scale: f32 = dense[r * cols..(r + 1) * cols]
                        .iter()
                        .zip(&x[m * cols..(m + 1) * cols])
                        .map(|(a, b)| (a * b).abs())
                        .sum();
                    assert!(
                        (f - p).abs() <= 1e-5 * scale,
                        "{family}, {dtype}, {cols} columns, {inputs} inputs: row {r}, \
                         input {m}: {f} against {p}"
                    );
                }
            }
        }
    }

    #[test]
    fn activations_on_the_8_bit_grid_multiply_exactly() {
        // Every value a multiple of its group's step (amax/127 with amax =
        // 1.27 in every group of 16): the 8-bit activations are exact, so the
        // product is the float one up to float rounding.
        let dtype = GgufDtype::Q4_K;
        let w = blocks(dtype, 4, 3);
        let x: Vec<f32> = (0..256)
            .map(|i| {
                if i % 16 == 0 {
                    1.27
                } else {
                    ((i * 37) % 255) as f32 / 100.0 - 1.27
                }
            })
            .collect();
        let (mut float, mut int) = (vec![0f32; 4], vec![0f32; 4]);
        rows_times(dtype, &w, 256, &x, &mut float, Arithmetic::f32()).unwrap();
        for family in CpuKernels::supported().unwrap() {
            rows_times(dtype, &w, 256, &x, &mut int, Arithmetic::int8(family)).unwrap();
            for (f, i) in float.iter().zip(&int) {
                assert!(
                    (f - i).abs() <= 1e-5 * f.abs().max(1.0),
                    "{family}: {f} against {i}"
                );
            }
        }
    }

    #[test]
    fn shapes_that_do_not_split_into_blocks_are_refused() {
        let w = blocks(GgufDtype::Q8_0, 4, 1);
        let x = vec![0f32; 48];
        let mut out = vec![0f32; 4];
        // 48 values per row are not whole 32-value blocks.
        let exact = Arithmetic::f32();
        assert!(rows_times(GgufDtype::Q8_0, &w, 48, &x, &mut out, exact).is_err());
        // An output of the wrong size.
        let x = vec![0f32; 64];
        let mut out = vec![0f32; 3];
        assert!(rows_times(GgufDtype::Q8_0, &w, 64, &x, &mut out, exact).is_err());
        // A type that is not a block type.
        let mut out = vec![0f32; 2];
        let int8 = Arithmetic::int8(CpuKernels::best().unwrap());
        assert!(rows_times(GgufDtype::F32, &w, 64, &x, &mut out, int8).is_err());
    }

    #[test]
    fn no_rows_of_activations_multiply_to_nothing_in_every_family() {
        let w = blocks(GgufDtype::Q8_0, 4, 1);
        for family in CpuKernels::supported().unwrap() {
            let mut out: Vec<f32> = Vec::new();
            rows_times(
                GgufDtype::Q8_0,
                &w,
                64,
                &[],
                &mut out,
                Arithmetic::int8(family),
            )
            .unwrap();
            assert!(out.is_empty(), "{family}");
        }
    }
}
