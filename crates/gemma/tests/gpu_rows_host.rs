//! The GPU kernels' weight-row readers, compiled for the host: the CUDA
//! device functions of `gemma::cuda::weight_rows_source` (the ones the fused
//! layer kernel and the logits GEMV run) built by the host's C++ compiler
//! with stand-ins for CUDA's intrinsics (`tests/gpu_rows_host/`), each
//! GGUF block type's rows multiplied by a row of activations as a warp
//! does, against the crate's own dequantizer. Runs on every machine, so the
//! decoders are checked where no GPU is. The compiler is `$CXX`, else `c++`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::blocks::random_blocks;
use gemma::cuda::weight_rows_source;
use gemma::quant::{dequantize, GgufDtype};

/// The block types the kernels read as stored, with their CUDA format
/// numbers (the `WF` template argument).
const FORMATS: [(GgufDtype, i32); 6] = [
    (GgufDtype::Q4_0, 1),
    (GgufDtype::Q5_0, 2),
    (GgufDtype::Q8_0, 3),
    (GgufDtype::Q4_K, 4),
    (GgufDtype::Q5_K, 5),
    (GgufDtype::Q6_K, 6),
];

/// The driver program, built once into `dir`.
fn build_driver(dir: &Path) -> PathBuf {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu_rows_host");
    std::fs::write(dir.join("weight_rows.cuh"), weight_rows_source()).unwrap();
    let driver = dir.join("driver");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&compiler)
        .args(["-std=c++17", "-O2", "-fno-strict-aliasing", "-I"])
        .arg(dir)
        .arg("-I")
        .arg(&sources)
        .arg(sources.join("driver.cpp"))
        .arg("-o")
        .arg(&driver)
        .output()
        .unwrap_or_else(|e| panic!("running the C++ compiler {compiler}: {e}"));
    assert!(
        out.status.success(),
        "the row readers do not compile for the host:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    driver
}

/// `n` activations in [-2, 2), seeded.
fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0xD134_2543_DE82_EF95) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

/// MLX affine rows: bits, group, scales and biases (one per group).
struct Affine<'a> {
    bits: usize,
    group: usize,
    scales: &'a [f32],
    biases: &'a [f32],
}

/// The driver's products of `rows` rows of `cols` values in CUDA format
/// `format` held in `data`.
fn driver_products(
    (driver, dir): (&Path, &Path),
    format: i32,
    (rows, cols): (usize, usize),
    data: &[u8],
    x: &[f32],
    affine: Option<Affine<'_>>,
) -> Vec<f64> {
    let file = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let mut command = Command::new(driver);
    command
        .args([format.to_string(), rows.to_string(), cols.to_string()])
        .arg(file("w.bin", data))
        .arg(file("x.bin", bytemuck::cast_slice(x)));
    if let Some(a) = affine {
        command
            .args([a.bits.to_string(), a.group.to_string()])
            .arg(file("scales.bin", bytemuck::cast_slice(a.scales)))
            .arg(file("biases.bin", bytemuck::cast_slice(a.biases)));
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

#[test]
fn each_block_type_multiplies_as_its_dequantized_values_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let driver = build_driver(dir.path());
    let rows = 7;
    let mut seed = 1;
    for (dtype, format) in FORMATS {
        let block = dtype.block_size() as usize;
        // Rows of one block up to 60 blocks of 256: 12B's hidden size (120
        // chunks of 32, not a whole number of warp steps) and a Q6_K row of
        // an odd number of blocks (rows starting 2 bytes off a 4-byte edge).
        let widths: &[usize] = if block == 256 {
            &[256, 768, 3840, 15360]
        } else {
            &[32, 256, 1152, 3840]
        };
        for &cols in widths {
            seed += 1;
            let blocks = random_blocks(dtype, rows * cols / block, seed);
            let values = dequantize(dtype, &blocks).unwrap();
            let x = activations(cols, seed);
            let ours = driver_products(
                (&driver, dir.path()),
                format,
                (rows, cols),
                &blocks,
                &x,
                None,
            );
            assert_close(&ours, &values, &x, &format!("{dtype}, {cols} values"));
        }
    }
}

/// Each product within 1e-5 of Σ |w·x| of the exact (f64) one.
fn assert_close(ours: &[f64], values: &[f32], x: &[f32], what: &str) {
    assert_eq!(ours.len(), values.len() / x.len(), "{what}: products");
    for (r, row) in values.chunks_exact(x.len()).enumerate() {
        let (exact, scale) = row.iter().zip(x).fold((0.0, 0.0), |(s, a), (w, x)| {
            let p = f64::from(*w) * f64::from(*x);
            (s + p, a + p.abs())
        });
        let gap = (ours[r] - exact).abs();
        assert!(
            gap <= 1e-5 * scale,
            "{what}, row {r}: {} against {exact} (Σ|w·x| {scale})",
            ours[r]
        );
    }
}

#[test]
fn mlx_affine_rows_multiply_as_their_values_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let driver = build_driver(dir.path());
    let (rows, cols) = (5, 3840);
    let mut seed = 100;
    for bits in [4, 8] {
        for group in [32, 64, 128] {
            seed += 1;
            let codes = random_blocks(GgufDtype::Q8_0, rows * cols * bits / 8 / 34 + 1, seed);
            let codes = &codes[..rows * cols * bits / 8];
            let groups = rows * cols / group;
            let scales: Vec<f32> = activations(groups, seed + 1)
                .iter()
                .map(|v| v * 0.01)
                .collect();
            let biases: Vec<f32> = activations(groups, seed + 2)
                .iter()
                .map(|v| v * 0.05)
                .collect();
            // Value i of a row: code i (bits·i LSB first in 32-bit words)
            // times its group's scale plus its bias.
            let values: Vec<f32> = (0..rows * cols)
                .map(|i| {
                    let bit = i * bits;
                    let word = u32::from_le_bytes(
                        codes[bit / 32 * 4..bit / 32 * 4 + 4].try_into().unwrap(),
                    );
                    let q = (word >> (bit % 32)) & ((1 << bits) - 1);
                    scales[i / group] * q as f32 + biases[i / group]
                })
                .collect();
            let x = activations(cols, seed + 3);
            let affine = Affine {
                bits,
                group,
                scales: &scales,
                biases: &biases,
            };
            let ours = driver_products(
                (&driver, dir.path()),
                7,
                (rows, cols),
                codes,
                &x,
                Some(affine),
            );
            assert_close(
                &ours,
                &values,
                &x,
                &format!("{bits}-bit affine, group {group}"),
            );
        }
    }
}
