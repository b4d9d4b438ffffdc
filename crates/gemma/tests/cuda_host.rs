//! CUDA device functions compiled for the host by its C++ compiler, with
//! stand-ins for CUDA's intrinsics (`tests/cuda_host/`), against the
//! crate's Rust code on every machine, so that the GPU's arithmetic is
//! checked where no GPU is:
//!
//! - the weight-row readers of `gemma::cuda::weight_rows_source` (the
//!   fused layer kernel's and the logits GEMV's): each GGUF block type's
//!   rows and MLX affine rows multiplied by a row of activations as a warp
//!   does, against the dequantized values;
//! - the tensor-core readers of `gemma::cuda::tensor_core_source`: the
//!   same rows 16 at a time, a warp of 32 host threads meeting at each
//!   `mma`;
//! - ggml's KV block codecs of `gemma::quant::KV_BLOCKS_CUDA` (a GPU
//!   cache's writes and reads): the bytes of every block equal to
//!   `quantize_into`'s, the values read back equal to `dequantize_into`'s.
//!
//! The compiler is `$CXX`, else `c++`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::blocks::random_blocks;
use gemma::cuda::{tensor_core_source, weight_rows_source};
use gemma::quant::{
    dequantize, dequantize_into, kv_block_type, quantize_into, GgufDtype, KV_BLOCKS_CUDA,
    QUANTIZABLE,
};

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

/// Program `name` (`tests/cuda_host/NAME.cpp`, which includes
/// `NAME.cuh`, the device functions `source`), built into `dir`.
fn build(dir: &Path, name: &str, source: &str) -> PathBuf {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cuda_host");
    std::fs::write(dir.join(format!("{name}.cuh")), source).unwrap();
    let program = dir.join(name);
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&compiler)
        .args([
            "-std=c++17",
            "-O2",
            "-pthread",
            "-fno-strict-aliasing",
            "-I",
        ])
        .arg(dir)
        .arg("-I")
        .arg(&sources)
        .arg(sources.join(format!("{name}.cpp")))
        .arg("-o")
        .arg(&program)
        .output()
        .unwrap_or_else(|e| panic!("running the C++ compiler {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{name}'s device functions do not compile for the host:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    program
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

/// `values` with the low 16 bits of each cleared: bfloat16 values, which
/// the driver passes to the readers as bfloat16 (the GPU's activations).
fn bfloat16_values(values: &[f32]) -> Vec<f32> {
    values
        .iter()
        .map(|v| f32::from_bits(v.to_bits() & 0xFFFF_0000))
        .collect()
}

/// MLX affine rows: bits, group, scales and biases (one per group).
#[derive(Clone, Copy)]
struct Affine<'a> {
    bits: usize,
    group: usize,
    scales: &'a [f32],
    biases: &'a [f32],
}

/// The driver's products of `rows` rows of `cols` values in CUDA format
/// `format` held in `data`, the activations `x` passed as bfloat16 where
/// `bf16` (they must be bfloat16 values).
fn driver_products(
    (driver, dir): (&Path, &Path),
    format: i32,
    (rows, cols): (usize, usize),
    data: &[u8],
    (x, bf16): (&[f32], bool),
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
    if bf16 {
        command.arg("bf16");
    }
    products_of(command)
}

/// What a driver printed, one product a line (it must succeed).
fn products_of(mut command: Command) -> Vec<f64> {
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
    let driver = build(dir.path(), "rows", weight_rows_source());
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
            for bf16 in [false, true] {
                let x = activations(cols, seed);
                let x = if bf16 { bfloat16_values(&x) } else { x };
                let ours = driver_products(
                    (&driver, dir.path()),
                    format,
                    (rows, cols),
                    &blocks,
                    (&x, bf16),
                    None,
                );
                let what = format!("{dtype}, {cols} values, bfloat16 activations: {bf16}");
                assert_close(&ours, &values, &x, &what);
            }
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

/// The tensor-core driver's products (`tests/cuda_host/tiles.cpp`) of
/// `rows` rows of `cols` values in CUDA format `format`, the units of each
/// tile dealt to `slices` warps; affine rows' scales and biases enter as
/// bfloat16 where `bf16` (they must be bfloat16 values), else as floats.
fn tile_products(
    (driver, dir): (&Path, &Path),
    format: i32,
    (rows, cols): (usize, usize),
    data: &[u8],
    x: &[f32],
    slices: usize,
    affine: Option<(Affine<'_>, bool)>,
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
        .arg(file("x.bin", bytemuck::cast_slice(x)))
        .arg(slices.to_string());
    if let Some((a, bf16)) = affine {
        command
            .args([a.bits.to_string(), a.group.to_string()])
            .arg(file("scales.bin", bytemuck::cast_slice(a.scales)))
            .arg(file("biases.bin", bytemuck::cast_slice(a.biases)))
            .arg(if bf16 { "bf16" } else { "f32" });
    }
    products_of(command)
}

/// The tensor-core driver's products of `data` (rows of CUDA format
/// `format` whose exact values are `values`) held to `values` against
/// seeded activations of very different sizes (the float16 operands' scale
/// follows the largest), each tile's units dealt to one warp and to three.
fn assert_tiles_close(
    driver: (&Path, &Path),
    format: i32,
    (rows, cols): (usize, usize),
    (data, values): (&[u8], &[f32]),
    seed: u64,
    affine: Option<(Affine<'_>, bool)>,
    what: &str,
) {
    for magnitude in [1.0f32, 3.0e4, 1.0e-3] {
        let x: Vec<f32> = activations(cols, seed)
            .iter()
            .map(|v| v * magnitude)
            .collect();
        let x = bfloat16_values(&x);
        for slices in [1, 3] {
            let ours = tile_products(driver, format, (rows, cols), data, &x, slices, affine);
            let what = format!("{what}, activations ×{magnitude}, {slices} slices");
            assert_close(&ours, values, &x, &what);
        }
    }
}

#[test]
fn each_block_type_multiplies_as_its_dequantized_values_on_the_host_tensor_cores() {
    let dir = tempfile::tempdir().unwrap();
    let source = format!("{}{}", weight_rows_source(), tensor_core_source());
    let driver = build(dir.path(), "tiles", &source);
    let rows = 32;
    let mut seed = 200;
    for (dtype, format) in FORMATS {
        let block = dtype.block_size() as usize;
        // One block to 15 blocks of 256 (12B's hidden size; Q6_K rows of an
        // odd number of blocks start 2 bytes off a 4-byte edge).
        let widths: &[usize] = if block == 256 {
            &[256, 768, 3840]
        } else {
            &[32, 288, 1152]
        };
        for &cols in widths {
            seed += 1;
            let blocks = random_blocks(dtype, rows * cols / block, seed);
            let values = dequantize(dtype, &blocks).unwrap();
            assert_tiles_close(
                (&driver, dir.path()),
                format,
                (rows, cols),
                (&blocks, &values),
                seed,
                None,
                &format!("tensor cores, {dtype}, {cols} values"),
            );
        }
    }
}

/// `n` random MLX affine codes of `bits` bits (packed least significant
/// bit first in 32-bit words, as bytes) with a scale and a bias for each
/// `group` of them, seeded.
fn affine_rows(bits: usize, group: usize, n: usize, seed: u64) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let mut codes = random_blocks(GgufDtype::Q8_0, n * bits / 8 / 34 + 1, seed);
    codes.truncate(n * bits / 8);
    let groups = n / group;
    let scales = activations(groups, seed + 1)
        .iter()
        .map(|v| v * 0.01)
        .collect();
    let biases = activations(groups, seed + 2)
        .iter()
        .map(|v| v * 0.05)
        .collect();
    (codes, scales, biases)
}

/// The values of affine rows: value i is code i (bits·i LSB first in
/// 32-bit words) times its group's scale plus its bias.
fn affine_values(codes: &[u8], a: Affine<'_>) -> Vec<f32> {
    (0..codes.len() * 8 / a.bits)
        .map(|i| {
            let bit = i * a.bits;
            let word =
                u32::from_le_bytes(codes[bit / 32 * 4..bit / 32 * 4 + 4].try_into().unwrap());
            let q = (word >> (bit % 32)) & ((1 << a.bits) - 1);
            a.scales[i / a.group] * q as f32 + a.biases[i / a.group]
        })
        .collect()
}

#[test]
fn mlx_affine_rows_multiply_as_their_values_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let driver = build(dir.path(), "rows", weight_rows_source());
    let (rows, cols) = (5, 3840);
    let mut seed = 100;
    for bits in [4, 8] {
        for group in [32, 64, 128] {
            seed += 1;
            let (codes, scales, biases) = affine_rows(bits, group, rows * cols, seed);
            let affine = Affine {
                bits,
                group,
                scales: &scales,
                biases: &biases,
            };
            let values = affine_values(&codes, affine);
            for bf16 in [false, true] {
                let x = activations(cols, seed + 3);
                let x = if bf16 { bfloat16_values(&x) } else { x };
                let ours = driver_products(
                    (&driver, dir.path()),
                    7,
                    (rows, cols),
                    &codes,
                    (&x, bf16),
                    Some(affine),
                );
                let what =
                    format!("{bits}-bit affine, group {group}, bfloat16 activations: {bf16}");
                assert_close(&ours, &values, &x, &what);
            }
        }
    }
}

#[test]
fn mlx_affine_rows_multiply_as_their_values_on_the_host_tensor_cores() {
    let dir = tempfile::tempdir().unwrap();
    let source = format!("{}{}", weight_rows_source(), tensor_core_source());
    let driver = build(dir.path(), "tiles", &source);
    let rows = 32;
    let mut seed = 300;
    for bits in [4, 8] {
        for group in [32, 64, 128] {
            // One group a row (a single unit, so that some of 3 slices
            // have none), 1B's and 12B's hidden sizes.
            for cols in [group, 1152, 3840] {
                seed += 1;
                let (codes, scales, biases) = affine_rows(bits, group, rows * cols, seed);
                // Scales and biases as the GPU's bfloat16 models hold them,
                // and as floats.
                for bf16 in [true, false] {
                    let (scales, biases) = if bf16 {
                        (bfloat16_values(&scales), bfloat16_values(&biases))
                    } else {
                        (scales.clone(), biases.clone())
                    };
                    let affine = Affine {
                        bits,
                        group,
                        scales: &scales,
                        biases: &biases,
                    };
                    let values = affine_values(&codes, affine);
                    assert_tiles_close(
                        (&driver, dir.path()),
                        7,
                        (rows, cols),
                        (&codes, &values),
                        seed + 3,
                        Some((affine, bf16)),
                        &format!(
                            "tensor cores, {bits}-bit affine, group {group}, {cols} values, \
                             bfloat16 scales: {bf16}"
                        ),
                    );
                }
            }
        }
    }
}

/// Rows to quantize: random values of three magnitudes, then blocks that
/// try the formats' edges: zeros, a single value, values on half steps
/// of a level (ties), equal values, ±0, a huge and a tiny range.
fn kv_rows(seed: u64) -> Vec<f32> {
    let mut rows = Vec::new();
    for (k, scale) in [0.01f32, 1.0, 300.0].into_iter().enumerate() {
        rows.extend(
            activations(32 * 64, seed + k as u64)
                .iter()
                .map(|v| v * scale),
        );
    }
    let mut block = |f: &dyn Fn(usize) -> f32| rows.extend((0..32).map(f));
    block(&|_| 0.0);
    block(&|j| if j == 5 { -3.0 } else { 0.0 });
    block(&|j| (j as f32 - 16.0) * 0.5 + 0.25);
    block(&|j| (j as f32 - 15.5) * 0.25);
    block(&|_| 1.5);
    block(&|j| if j % 2 == 0 { 0.0 } else { -0.0 });
    block(&|j| if j == 0 { 6.0e4 } else { j as f32 });
    block(&|j| j as f32 * 1e-12);
    block(&|j| -(j as f32) / 7.0);
    rows
}

#[test]
fn kv_blocks_quantize_and_decode_as_the_cpu_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let program = build(dir.path(), "kv_blocks", KV_BLOCKS_CUDA);
    let x = kv_rows(7);
    let blocks = x.len() / 32;
    let values_file = dir.path().join("values.bin");
    std::fs::write(&values_file, bytemuck::cast_slice(&x)).unwrap();
    for dtype in QUANTIZABLE {
        let q = kv_block_type(dtype).expect("a KV block type");
        let (bytes_file, decoded_file) = (
            dir.path().join("blocks.bin"),
            dir.path().join("decoded.bin"),
        );
        let out = Command::new(&program)
            .args([q.to_string(), blocks.to_string()])
            .args([&values_file, &bytes_file, &decoded_file])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs = std::fs::read(&bytes_file).unwrap();
        let mut ours = vec![0u8; blocks * dtype.type_size() as usize];
        quantize_into(dtype, &x, &mut ours).unwrap();
        let size = dtype.type_size() as usize;
        for (b, (gpu, cpu)) in theirs
            .chunks_exact(size)
            .zip(ours.chunks_exact(size))
            .enumerate()
        {
            assert_eq!(
                gpu,
                cpu,
                "{dtype}: block {b} of {:?}",
                &x[32 * b..32 * b + 32]
            );
        }
        let decoded: Vec<f32> = std::fs::read(&decoded_file)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut expected = vec![0f32; x.len()];
        dequantize_into(dtype, bytemuck::cast_slice(&ours), &mut expected).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&decoded), bits(&expected), "{dtype}: decoded values");
    }
}
