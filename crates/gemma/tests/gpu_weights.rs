//! Quantized weights read as stored by the GPU kernels: GGUF blocks
//! dequantized on the GPU bit for bit as gguf-py (the fixtures), one row
//! multiplied as the dequantized values are (GGUF and MLX affine rows), a
//! tiny model of GGUF blocks decoding (eagerly and through the fused layer
//! kernel) as its dequantized twin, and, given a GGUF file in
//! `GEMMA_MLX_GPU_GGUF`, that file native against dequantized. They need a
//! CUDA build of MLX (the GPU machine); elsewhere each test says so and
//! returns.

mod common;

use std::path::Path;

use common::blocks::random_blocks;
use common::diff::kl_divergence;
use common::fixed_steps::{eager, max_diff, mixed, tokens};
use common::gpu::{floats, on_gpu};
use common::models::{random_model, tiny_config};
use gemma::cache::CacheFormat;
use gemma::cuda::{dequantize_rows, rows_gemv, LayerWeights, WeightRows};
use gemma::linear::{GgufMatrix, Linear};
use gemma::load::{
    load, quantize_weights, Arithmetic, CpuKernels, LoadOptions, ModelSource, WeightStorage,
};
use gemma::model::Gemma3;
use gemma::quant::{dequantize, GgufDtype};
use mlx_core::{quantize, random, Array, Dtype};

/// The block types the GPU kernels read, with their fixture names.
const TYPES: [(GgufDtype, &str); 6] = [
    (GgufDtype::Q4_0, "q4_0"),
    (GgufDtype::Q5_0, "q5_0"),
    (GgufDtype::Q8_0, "q8_0"),
    (GgufDtype::Q4_K, "q4_k"),
    (GgufDtype::Q5_K, "q5_k"),
    (GgufDtype::Q6_K, "q6_k"),
];

/// gguf-py's fixture of `name`: random blocks (one row) and their values.
fn fixture(name: &str) -> (Vec<u8>, Vec<f32>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/blocks");
    let blocks = std::fs::read(dir.join(format!("{name}.blocks.bin"))).unwrap();
    let values = std::fs::read(dir.join(format!("{name}.expected.bin")))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (blocks, values)
}

/// `rows` rows made of a fixture's blocks, row `r` rotated by `r` blocks,
/// and their values.
fn fixture_rows(dtype: GgufDtype, name: &str, rows: usize) -> (GgufMatrix, Vec<f32>) {
    let (blocks, values) = fixture(name);
    let (bytes, block) = (dtype.type_size() as usize, dtype.block_size() as usize);
    let n = blocks.len() / bytes;
    let (mut all, mut expected) = (Vec::new(), Vec::new());
    for r in 0..rows {
        for b in 0..n {
            let from = (b + r) % n;
            all.extend_from_slice(&blocks[from * bytes..(from + 1) * bytes]);
            expected.extend_from_slice(&values[from * block..(from + 1) * block]);
        }
    }
    (matrix(dtype, &all, rows, n * block), expected)
}

/// A GGUF matrix of `rows` rows of `cols` values of `dtype` from `blocks`.
fn matrix(dtype: GgufDtype, blocks: &[u8], rows: usize, cols: usize) -> GgufMatrix {
    let row_bytes = blocks.len() / rows;
    GgufMatrix {
        bytes: Array::from_bytes(blocks, &[rows as i32, row_bytes as i32], Dtype::Uint8).unwrap(),
        dtype,
        cols: cols as i32,
        arithmetic: Arithmetic::int8(CpuKernels::Portable),
    }
}

#[test]
fn gguf_rows_dequantize_on_the_gpu_bit_for_bit_as_gguf_py() {
    if !on_gpu() {
        return;
    }
    for (dtype, name) in TYPES {
        let (g, expected) = fixture_rows(dtype, name, 3);
        let rows = WeightRows::blocks(&g)
            .unwrap()
            .expect("a type the kernels read");
        let ours = floats(&dequantize_rows(&rows, Dtype::Float32).unwrap());
        let same = ours
            .iter()
            .zip(&expected)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        assert_eq!(same, expected.len(), "{dtype}: values equal to gguf-py's");
        // In bfloat16: gguf-py's values rounded once, as MLX rounds them.
        let rounded = Array::from_slice(&expected, &[3, g.cols])
            .unwrap()
            .astype(Dtype::Bfloat16)
            .unwrap();
        let ours = dequantize_rows(&rows, Dtype::Bfloat16).unwrap();
        assert_eq!(floats(&ours), floats(&rounded), "{dtype} in bfloat16");
        eprintln!("{dtype}: {} values bit for bit", expected.len());
    }
}

/// Σ w·x in f64 and Σ |w·x| of each row of `w` (`[rows, cols]`) with `x`.
fn host_products(w: &[f32], x: &[f32]) -> Vec<(f64, f64)> {
    w.chunks_exact(x.len())
        .map(|row| {
            row.iter().zip(x).fold((0.0, 0.0), |(s, a), (w, x)| {
                let p = f64::from(*w) * f64::from(*x);
                (s + p, a + p.abs())
            })
        })
        .collect()
}

#[test]
fn gguf_and_affine_rows_multiply_one_row_as_their_values_do() {
    if !on_gpu() {
        return;
    }
    let key = random::key(5).unwrap();
    for (dtype, name) in TYPES {
        let (g, values) = fixture_rows(dtype, name, 5);
        let rows = WeightRows::blocks(&g)
            .unwrap()
            .expect("a type the kernels read");
        for (xdtype, tolerance) in [(Dtype::Float32, 1e-5), (Dtype::Bfloat16, 1e-2)] {
            let x = random::normal(&[1, 1, g.cols], Dtype::Float32, 0.0, 1.0, Some(&key))
                .unwrap()
                .astype(xdtype)
                .unwrap();
            let ours = floats(&rows_gemv(&x, &rows).unwrap());
            for (r, (exact, scale)) in host_products(&values, &floats(&x)).into_iter().enumerate() {
                let gap = (f64::from(ours[r]) - exact).abs();
                assert!(
                    gap <= tolerance * scale,
                    "{dtype}, {xdtype:?}, row {r}: {} against {exact}",
                    ours[r]
                );
            }
        }
    }
    // MLX's affine rows (bfloat16 scales and biases) against their own
    // dequantization.
    let w = random::normal(&[48, 512], Dtype::Float32, 0.0, 0.05, Some(&key))
        .unwrap()
        .astype(Dtype::Bfloat16)
        .unwrap();
    for bits in [4, 8] {
        for group in [32, 64, 128] {
            let q = quantize(&w, group, bits).unwrap();
            let dense = q.dequantize().unwrap();
            let linear = Linear::Quantized(q);
            let rows = WeightRows::of(&linear, Dtype::Bfloat16)
                .unwrap()
                .expect("affine rows");
            let ours = floats(&dequantize_rows(&rows, Dtype::Bfloat16).unwrap());
            let gap = max_diff(&ours, &floats(&dense));
            assert!(
                gap <= 1e-2 * 0.25,
                "{bits} bits, group {group}: dequantized {gap}"
            );
            let x = random::normal(&[1, 1, 512], Dtype::Float32, 0.0, 1.0, Some(&key))
                .unwrap()
                .astype(Dtype::Bfloat16)
                .unwrap();
            let ours = floats(&rows_gemv(&x, &rows).unwrap());
            let theirs = floats(&x.linear(&dense).unwrap());
            let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let gap = max_diff(&ours, &theirs);
            assert!(
                gap <= 1e-2 * scale,
                "{bits} bits, group {group}: {gap} of {scale}"
            );
        }
    }
}

#[test]
fn gguf_rows_multiply_one_row_on_the_tensor_cores_as_their_values_do() {
    if !on_gpu() {
        return;
    }
    // Tiles of 16 rows and bfloat16 activations take the tensor-core GEMV
    // for the block types GEMMA_MLX_TENSOR_CORES names (by default the
    // K-quants of rows of 2048 values or more;
    // `q4_0,q5_0,q8_0,q4_k,q5_k,q6_k` checks every reader), the scalar one
    // for the others.
    let key = random::key(6).unwrap();
    let (rows, cols) = (48, 2048);
    use GgufDtype::*;
    for (n, dtype) in [Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K].into_iter().enumerate() {
        let blocks = random_blocks(
            dtype,
            rows * cols / dtype.block_size() as usize,
            40 + n as u64,
        );
        let values = dequantize(dtype, &blocks).unwrap();
        let g = matrix(dtype, &blocks, rows, cols);
        let w = WeightRows::blocks(&g)
            .unwrap()
            .expect("a type the kernels read");
        let x = random::normal(&[1, 1, cols as i32], Dtype::Float32, 0.0, 1.0, Some(&key))
            .unwrap()
            .astype(Dtype::Bfloat16)
            .unwrap();
        let ours = floats(&rows_gemv(&x, &w).unwrap());
        for (r, (exact, scale)) in host_products(&values, &floats(&x)).into_iter().enumerate() {
            let gap = (f64::from(ours[r]) - exact).abs();
            assert!(
                gap <= 1e-2 * scale,
                "{dtype}, row {r}: {} against {exact}",
                ours[r]
            );
        }
    }
}

#[test]
fn mlx_affine_rows_multiply_one_row_on_the_tensor_cores_as_their_values_do() {
    if !on_gpu() {
        return;
    }
    // Tiles of 16 rows and bfloat16 activations take the tensor-core GEMV
    // where GEMMA_MLX_TENSOR_CORES names `affine` (not by default), the
    // scalar one otherwise; both against MLX's own dequantization.
    let key = random::key(7).unwrap();
    let (rows, cols) = (48, 2048);
    let w = random::normal(&[rows, cols], Dtype::Float32, 0.0, 0.05, Some(&key))
        .unwrap()
        .astype(Dtype::Bfloat16)
        .unwrap();
    let x = random::normal(&[1, 1, cols], Dtype::Float32, 0.0, 1.0, Some(&key))
        .unwrap()
        .astype(Dtype::Bfloat16)
        .unwrap();
    for bits in [4, 8] {
        for group in [32, 64, 128] {
            let q = quantize(&w, group, bits).unwrap();
            let dense = floats(&q.dequantize().unwrap());
            let linear = Linear::Quantized(q);
            let affine = WeightRows::of(&linear, Dtype::Bfloat16)
                .unwrap()
                .expect("affine rows");
            let ours = floats(&rows_gemv(&x, &affine).unwrap());
            for (r, (exact, scale)) in host_products(&dense, &floats(&x)).into_iter().enumerate() {
                let gap = (f64::from(ours[r]) - exact).abs();
                assert!(
                    gap <= 1e-2 * scale,
                    "{bits} bits, group {group}, row {r}: {} against {exact}",
                    ours[r]
                );
            }
        }
    }
}

/// A projection of `rows` × `cols` random blocks of `dtype`, and the same
/// values dequantized into a dense bfloat16 matrix.
fn random_projection(dtype: GgufDtype, rows: usize, cols: usize, seed: u64) -> (Linear, Linear) {
    let blocks = random_blocks(dtype, rows * cols / dtype.block_size() as usize, seed);
    let values = dequantize(dtype, &blocks).unwrap();
    let dense = Array::from_slice(&values, &[rows as i32, cols as i32])
        .unwrap()
        .astype(Dtype::Bfloat16)
        .unwrap();
    (
        Linear::Gguf(matrix(dtype, &blocks, rows, cols)),
        Linear::Dense(dense),
    )
}

/// A tiny bfloat16 model (hidden 256, 4 query and 2 key/value heads of 64,
/// MLP 512) whose projections and embedding are random GGUF blocks of
/// every type the kernels read (Q/K/V as three parts of two types), and
/// its twin holding the same values dequantized.
fn gguf_model_and_twin() -> (Gemma3, Gemma3) {
    let mut c = tiny_config(3);
    (c.hidden_size, c.intermediate_size) = (256, 512);
    c.sliding_window = 8;
    let mut blocks = random_model(c.clone(), Dtype::Bfloat16, 23);
    let mut twin = blocks.clone();
    let (hq, hkv, i) = (4 * 64, 2 * 64, 512);
    let mut seed = 1;
    let mut next = |dtype: GgufDtype, rows: usize, cols: usize| {
        seed += 1;
        random_projection(dtype, rows, cols, seed)
    };
    use GgufDtype::*;
    let types = [Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K];
    for (n, (layer, dense)) in blocks.layers.iter_mut().zip(&mut twin.layers).enumerate() {
        let pick = |k: usize| types[(n + k) % types.len()];
        let (q, dq) = next(pick(0), hq, 256);
        let (k, dk) = next(pick(0), hkv, 256);
        let (v, dv) = next(pick(1), hkv, 256);
        layer.qkv_proj = Linear::Parts(vec![q, k, v]);
        dense.qkv_proj = Linear::Parts(vec![dq, dk, dv]);
        (layer.o_proj, dense.o_proj) = next(pick(2), 256, hq);
        let (g, dg) = next(pick(3), i, 256);
        let (u, du) = next(pick(4), i, 256);
        layer.gate_up_proj = Linear::Parts(vec![g, u]);
        dense.gate_up_proj = Linear::Parts(vec![dg, du]);
        (layer.down_proj, dense.down_proj) = next(pick(5), 256, i);
    }
    (blocks.embed, twin.embed) = next(Q6_K, c.vocab_size, 256);
    (blocks, twin)
}

#[test]
fn a_model_of_gguf_blocks_decodes_as_its_dequantized_twin() {
    if !on_gpu() {
        return;
    }
    let (mut blocks, mut twin) = gguf_model_and_twin();
    for (n, layer) in blocks.layers.iter().enumerate() {
        let weights = LayerWeights::of(layer, blocks.layer_geometry(n), Dtype::Bfloat16).unwrap();
        assert!(
            weights.is_some(),
            "layer {n}: the fused kernel reads its blocks"
        );
    }
    // The whole sequence at once: block rows dequantized for the products.
    let (ours, theirs) = (eager(&blocks), eager(&twin));
    let spread = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = max_diff(&ours, &theirs);
    eprintln!("prefill: max |Δ logit| {d:e} of {spread}");
    assert!(d < 2e-2 * spread, "prefill: {d} of {spread}");
    // Single tokens: our GEMV, then the fused layer kernel reading blocks.
    for kernels in [false, true] {
        blocks.gpu_kernels = kernels;
        twin.gpu_kernels = kernels;
        for compiled in [false, true] {
            let (ours, _) = mixed(&blocks, compiled);
            let (theirs, _) = mixed(&twin, compiled);
            let d = max_diff(&ours, &theirs);
            eprintln!("kernels {kernels}, compiled {compiled}: max |Δ logit| {d:e} of {spread}");
            assert!(
                d < 2e-2 * spread,
                "kernels {kernels}, compiled {compiled}: {d}"
            );
        }
    }
}

/// `model`'s projections as dense matrices: MLX affine ones dequantized.
fn dequantized_twin(model: &Gemma3) -> Gemma3 {
    let dense = |l: &Linear| match l {
        Linear::Quantized(q) => Linear::Dense(q.dequantize().unwrap()),
        other => other.clone(),
    };
    let mut twin = model.clone();
    twin.embed = dense(&model.embed);
    for layer in &mut twin.layers {
        layer.qkv_proj = dense(&layer.qkv_proj);
        layer.o_proj = dense(&layer.o_proj);
        layer.gate_up_proj = dense(&layer.gate_up_proj);
        layer.down_proj = dense(&layer.down_proj);
    }
    twin
}

#[test]
fn a_model_of_mlx_affine_rows_decodes_through_the_fused_kernel_as_its_dequantized_twin() {
    if !on_gpu() {
        return;
    }
    let mut c = tiny_config(3);
    (c.hidden_size, c.intermediate_size) = (256, 512);
    c.sliding_window = 8;
    for (bits, group) in [(4, 64), (8, 32), (4, 128)] {
        let mut model = random_model(c.clone(), Dtype::Bfloat16, 29);
        quantize_weights(&mut model, bits, group).unwrap();
        let mut twin = dequantized_twin(&model);
        for (n, layer) in model.layers.iter().enumerate() {
            let weights =
                LayerWeights::of(layer, model.layer_geometry(n), Dtype::Bfloat16).unwrap();
            assert!(
                weights.is_some(),
                "{bits} bits: layer {n} in the fused kernel"
            );
        }
        model.gpu_kernels = true;
        twin.gpu_kernels = true;
        let (ours, _) = mixed(&model, true);
        let (theirs, _) = mixed(&twin, true);
        let spread = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = max_diff(&ours, &theirs);
        eprintln!("{bits} bits, group {group}: max |Δ logit| {d:e} of {spread}");
        // bfloat16 roundings of logits spanning about ±1.3 (a step of
        // 2^-7 there): measured on the H200 2.3e-2 (4 bits, group 64) and
        // 2.7e-2 (8 bits, group 32), about 3 steps.
        assert!(
            d < 4e-2 * spread,
            "{bits} bits, group {group}: {d} of {spread}"
        );
    }
}

#[test]
fn a_gguf_file_native_on_the_gpu_gives_the_logits_of_its_dequantized_weights() {
    let Some(path) = std::env::var_os("GEMMA_MLX_GPU_GGUF") else {
        eprintln!("SKIPPED: GEMMA_MLX_GPU_GGUF names no GGUF file");
        return;
    };
    if !on_gpu() {
        return;
    }
    let load_as = |weights| {
        let options = LoadOptions {
            dtype: Dtype::Bfloat16,
            quantize: None,
            weights,
        };
        let mut loaded = load(
            &ModelSource::Gguf(path.clone().into()),
            options,
            &mut |_, _| {},
        )
        .unwrap();
        loaded.model.gpu_kernels = true;
        loaded.model
    };
    let native = load_as(WeightStorage::Native(Arithmetic::int8(
        CpuKernels::Portable,
    )));
    let dense = load_as(WeightStorage::Dequantized);
    let vocab = native.config.vocab_size;
    let ids: Vec<i32> = (0..64).map(|i| 2 + (i * 7919 + 11) % 20000).collect();
    let logits = |model: &Gemma3| {
        let mut caches = model.make_caches(CacheFormat::COMPUTE).unwrap();
        floats(&model.forward(&tokens(&ids), &mut caches).unwrap())
    };
    let (ours, theirs) = (logits(&native), logits(&dense));
    let klds: Vec<f64> = ours
        .chunks_exact(vocab)
        .zip(theirs.chunks_exact(vocab))
        .map(|(a, b)| kl_divergence(b, a))
        .collect();
    let mean = klds.iter().sum::<f64>() / klds.len() as f64;
    let same = ours
        .chunks_exact(vocab)
        .zip(theirs.chunks_exact(vocab))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    eprintln!(
        "{}: 64 positions, native against dequantized: mean KLD {mean:e}, max |Δ logit| {:e}, \
         {same} of 64 top tokens the same",
        Path::new(&path).display(),
        max_diff(&ours, &theirs)
    );
    assert!(mean < 1e-2, "mean KLD {mean}");
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
        .0
}
