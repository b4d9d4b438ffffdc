//! Our CPU kernels over GGUF blocks as stored (`gemma::quant::rows_times`),
//! one row of activations (a decode step) against the default model's own
//! matrices: the tied embedding (the logits' product, most of the file's
//! bytes) and layer 0's projections, with float32 activations and with
//! 8-bit ones on every CPU kernel family this CPU runs (`int8-portable`,
//! the Rust kernels: what CPUs without AVX2, and types `mlx-c` has no
//! kernel for, run; `int8-avx2`; `int8-avx512`).
//! A second group (`gguf_prefill`) multiplies layer 0's projections with 16
//! and 256 rows of activations (a short prompt, a prompt chunk), our
//! multi-row kernels of each x86 family (`int8-avx2`: 256-bit tiles;
//! `int8-avx512`: 512-bit VNNI tiles) against MLX's float32 matmul over the
//! matrix dequantized for the product;
//! its throughput is multiply-adds.
//! Throughput is the matrix's bytes. Needs the default model (`cargo xtask
//! setup`); without it the benchmark says so and measures nothing.

use std::path::Path;
use std::time::Duration;

use benches::or_exit;
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use gemma::gguf::GgufFile;
use gemma::linear::GgufMatrix;
use gemma::quant::{can_multiply, rows_times, Arithmetic};
use mlx_core::block_dot::CpuKernels;
use mlx_core::{Array, Dtype};

/// The tensors measured: the embedding and layer 0's projections.
fn measured(name: &str) -> bool {
    name == "token_embd.weight" || name.starts_with("blk.0.")
}

fn main() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/model/gemma-3-270m-q4_k_m.gguf");
    if !path.exists() {
        println!("SKIPPED: the default model {} is missing", path.display());
        return;
    }
    let file = or_exit(GgufFile::open(&path));
    let families = or_exit(CpuKernels::supported());
    let mut arithmetics = vec![("f32".to_string(), Arithmetic::f32())];
    arithmetics.extend(
        families
            .iter()
            .map(|&f| (format!("int8-{f}"), Arithmetic::int8(f))),
    );
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    let mut group = c.benchmark_group("gguf_rows_times");
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    for info in file.tensors() {
        let shape = info.row_major_shape();
        if !measured(&info.name) || shape.len() != 2 || !can_multiply(info.dtype) {
            continue;
        }
        let (rows, cols) = (shape[0] as usize, shape[1] as usize);
        let w = file.tensor_bytes(info);
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let mut out = vec![0f32; rows];
        group.throughput(Throughput::Bytes(w.len() as u64));
        for (label, arithmetic) in &arithmetics {
            let id = BenchmarkId::new(
                format!("{}/{}", info.name, label),
                format!("{}_{rows}x{cols}", info.dtype),
            );
            group.bench_function(id, |b| {
                b.iter(|| or_exit(rows_times(info.dtype, w, cols, &x, &mut out, *arithmetic)))
            });
        }
    }
    group.finish();
    let x86_families: Vec<CpuKernels> = families
        .iter()
        .copied()
        .filter(|&f| f != CpuKernels::Portable)
        .collect();
    prefill(&mut c, &file, &x86_families);
    c.final_summary();
}

/// Rows of activations in the prefill group: a short prompt (a chat turn)
/// and one chunk of a long one.
const PREFILL_ROWS: [usize; 2] = [16, 256];

/// Layer 0's projections times [`PREFILL_ROWS`] rows of activations: the
/// multi-row kernels of each of `families` with 8-bit activations against the other
/// prefill path, the matrix dequantized for the product and multiplied by
/// MLX's float32 matmul (`GgufMatrix::times` with float32 activations), and
/// that path's dequantization alone (its share of the product).
fn prefill(c: &mut Criterion, file: &GgufFile, families: &[CpuKernels]) {
    let mut group = c.benchmark_group("gguf_prefill");
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    for info in file.tensors() {
        let shape = info.row_major_shape();
        if !info.name.starts_with("blk.0.") || shape.len() != 2 || !can_multiply(info.dtype) {
            continue;
        }
        let (rows, cols) = (shape[0] as usize, shape[1] as usize);
        let w = file.tensor_bytes(info);
        let matrix = GgufMatrix {
            bytes: or_exit(Array::from_bytes(
                w,
                &[rows as i32, (w.len() / rows) as i32],
                Dtype::Uint8,
            )),
            dtype: info.dtype,
            cols: cols as i32,
            arithmetic: Arithmetic::f32(),
        };
        for inputs in PREFILL_ROWS {
            let x: Vec<f32> = (0..inputs * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut out = vec![0f32; rows * inputs];
            group.throughput(Throughput::Elements((rows * cols * inputs) as u64));
            let id = |label: &str| {
                BenchmarkId::new(
                    format!("{}/{label}/{inputs}", info.name),
                    format!("{}_{rows}x{cols}", info.dtype),
                )
            };
            for &family in families {
                group.bench_function(id(&format!("int8-{family}")), |b| {
                    b.iter(|| {
                        or_exit(rows_times(
                            info.dtype,
                            w,
                            cols,
                            &x,
                            &mut out,
                            Arithmetic::int8(family),
                        ))
                    })
                });
            }
            let xs = or_exit(Array::from_slice(&x, &[inputs as i32, cols as i32]));
            group.bench_function(id("dequantize-only"), |b| {
                b.iter(|| or_exit(or_exit(matrix.dequantized()).eval()))
            });
            group.bench_function(id("dequantized-f32-matmul"), |b| {
                b.iter(|| or_exit(or_exit(matrix.times(&xs)).eval()))
            });
        }
    }
    group.finish();
}
