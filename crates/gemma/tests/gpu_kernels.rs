//! The fused GPU kernels against MLX's own operations. They need a CUDA build
//! of MLX (the GPU machine); elsewhere each test says so and returns.

mod common;

use common::fixed_steps::{
    eager, max_diff, mixed, scheduled, tiny_model, tiny_model_with_heads, Steps,
};
use common::gpu::{floats, on_gpu};
use common::models::random_model;
use gemma::cache::turbo::{rotate, unrotate};
use gemma::cache::{
    Attend, CacheFormat, KeyMask, KvFormat, KvStore, LayerFormats, LayerKv, QueryRounding, Rotation,
};
use gemma::config::Gemma3Config;
use gemma::cuda::{
    decode_attention, decode_attention_stored, decode_layer, grid_barrier, linear_row,
    qk_norm_rope, resident_blocks, residual_norms, LayerWeights, Rotary,
};
use gemma::forward::cache_attention;
use gemma::forward::decode_step::DecodeStep;
use gemma::model::Gemma3;
use mlx_core::fast::RopeOffset;
use mlx_core::{random, Array, Dtype};

/// Normal samples of standard deviation `std`, drawn in float32 and cast
/// to `dtype`.
fn normal(shape: &[i32], std: f32, key: &Array, dtype: Dtype) -> Array {
    random::normal(shape, Dtype::Float32, 0.0, std, Some(key))
        .unwrap()
        .astype(dtype)
        .unwrap()
}

/// Largest |a − b| over the largest |b|.
fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn residual_norms_kernel_matches_mlx_operations() {
    if !on_gpu() {
        return;
    }
    let key = random::key(3).unwrap();
    let (k1, k2) = random::split(&key).unwrap();
    for (dtype, tolerance) in [(Dtype::Float32, 1e-5), (Dtype::Bfloat16, 1e-2)] {
        for (rows, hidden) in [(1, 640), (3, 1152), (2, 5376), (5, 100)] {
            let x = normal(&[1, rows, hidden], 4.0, &k1, dtype);
            let r = normal(&[1, rows, hidden], 30.0, &k2, dtype);
            let w1 = random::uniform(0.5, 1.5, &[hidden], dtype, Some(&k1)).unwrap();
            let w2 = random::uniform(0.0, 2.0, &[hidden], dtype, Some(&k2)).unwrap();
            let (h, n) = residual_norms(&x, &r, &w1, &w2, 1e-6, true).unwrap();
            let (h0, n0) = residual_norms(&x, &r, &w1, &w2, 1e-6, false).unwrap();
            let (gh, gn) = (
                relative_gap(&floats(&h), &floats(&h0)),
                relative_gap(&floats(&n), &floats(&n0)),
            );
            eprintln!("{dtype:?} {rows}x{hidden}: sum {gh:.2e}, norm {gn:.2e}");
            assert!(
                gh <= tolerance && gn <= tolerance,
                "{dtype:?} {rows}x{hidden}: {gh} {gn}"
            );
        }
    }
}

/// A float16 KV cache under a bfloat16 model gives a float32 attention
/// branch: the residual then takes MLX's operations, on any device, instead
/// of a kernel whose inputs share one dtype.
#[test]
fn residual_norms_of_mixed_dtypes_take_mlx_operations() {
    let key = random::key(13).unwrap();
    let x = normal(&[1, 2, 640], 4.0, &key, Dtype::Bfloat16);
    let r = normal(&[1, 2, 640], 30.0, &key, Dtype::Float32);
    let w = random::uniform(0.5, 1.5, &[640], Dtype::Bfloat16, Some(&key)).unwrap();
    let (h, n) = residual_norms(&x, &r, &w, &w, 1e-6, true).unwrap();
    let (h0, n0) = residual_norms(&x, &r, &w, &w, 1e-6, false).unwrap();
    assert_eq!(h.dtype(), Dtype::Float32);
    assert_eq!((floats(&h), floats(&n)), (floats(&h0), floats(&n0)));
}

#[test]
fn qk_norm_rope_kernel_matches_mlx_operations() {
    if !on_gpu() {
        return;
    }
    let key = random::key(4).unwrap();
    let (k1, k2) = random::split(&key).unwrap();
    // (heads, kv heads, head dim) of 1B and 27B; sliding and global rotary.
    for (dtype, tolerance) in [(Dtype::Float32, 1e-5), (Dtype::Bfloat16, 1e-2)] {
        for (hq, hkv, d) in [(4, 1, 256), (32, 16, 128)] {
            for (l, rotary) in [
                (
                    1,
                    Rotary {
                        offset: RopeOffset::Fixed(0),
                        base: 10_000.0,
                        scale: 1.0,
                    },
                ),
                (
                    1,
                    Rotary {
                        offset: RopeOffset::Fixed(3000),
                        base: 1_000_000.0,
                        scale: 0.125,
                    },
                ),
                (
                    7,
                    Rotary {
                        offset: RopeOffset::Fixed(500),
                        base: 10_000.0,
                        scale: 1.0,
                    },
                ),
            ] {
                let q = normal(&[2, l, hq * d], 3.0, &k1, dtype);
                let k = normal(&[2, l, hkv * d], 3.0, &k2, dtype);
                let qw = random::uniform(0.5, 1.5, &[d], dtype, Some(&k1)).unwrap();
                let kw = random::uniform(0.5, 1.5, &[d], dtype, Some(&k2)).unwrap();
                let run = |fused| {
                    qk_norm_rope(&q, &k, (&qw, &kw), (hq, hkv, d), rotary, 1e-6, fused).unwrap()
                };
                let ((qf, kf), (q0, k0)) = (run(true), run(false));
                assert_eq!(qf.shape(), q0.shape());
                assert_eq!(kf.shape(), k0.shape());
                let (gq, gk) = (
                    relative_gap(&floats(&qf), &floats(&q0)),
                    relative_gap(&floats(&kf), &floats(&k0)),
                );
                eprintln!("{dtype:?} {hq}/{hkv}x{d} L={l} {rotary:?}: q {gq:.2e}, k {gk:.2e}");
                assert!(gq <= tolerance && gk <= tolerance, "{gq} {gk}");
            }
        }
    }
}

#[test]
fn gemv_kernel_matches_mlx_matmul() {
    if !on_gpu() {
        return;
    }
    let key = random::key(5).unwrap();
    let (k1, k2) = random::split(&key).unwrap();
    for (dtype, tolerance) in [(Dtype::Float32, 1e-5), (Dtype::Bfloat16, 1e-2)] {
        // 1B's q/k/v, gate/up, down and output projections; a K the kernel
        // cannot load 16 bytes at a time (MLX's matmul then).
        for (n, k) in [
            (1536, 1152),
            (13824, 1152),
            (1152, 6912),
            (262_144, 640),
            (7, 100),
        ] {
            let x = normal(&[1, 1, k], 1.0, &k1, dtype);
            let w = normal(&[n, k], 0.05, &k2, dtype);
            let fused = linear_row(&x, &w, true).unwrap();
            let plain = linear_row(&x, &w, false).unwrap();
            assert_eq!(fused.shape(), vec![1, 1, n]);
            let gap = relative_gap(&floats(&fused), &floats(&plain));
            eprintln!("{dtype:?} {n}x{k}: {gap:.2e}");
            assert!(gap <= tolerance, "{dtype:?} {n}x{k}: {gap}");
        }
    }
}

#[test]
fn decode_attention_kernel_matches_mlx_attention() {
    if !on_gpu() {
        return;
    }
    let key = random::key(6).unwrap();
    let (k1, k2) = random::split(&key).unwrap();
    let k3 = random::split(&k2).unwrap().0;
    for (dtype, tolerance) in [(Dtype::Float32, 1e-5), (Dtype::Bfloat16, 1e-2)] {
        // 1B / 270M (4 over 1), 27B (32 over 16), a small head; buffers
        // partly valid, exactly full, and holding one key.
        for (hq, hkv, d) in [(4, 1, 256), (32, 16, 128), (8, 8, 64)] {
            for (capacity, valid) in [(512, 300), (2304, 2304), (256, 1), (8192, 5000)] {
                let q = normal(&[1, hq, 1, d], 1.0, &k1, dtype);
                let keys = normal(&[1, hkv, capacity, d], 1.0, &k2, dtype);
                let values = normal(&[1, hkv, capacity, d], 1.0, &k3, dtype);
                let count = Array::from_slice(&[valid], &[1]).unwrap();
                let scale = 1.0 / (d as f32).sqrt();
                let ours = decode_attention(&q, &keys, &values, &count, scale)
                    .unwrap()
                    .expect("the kernel takes these shapes");
                let theirs = host_attention(&q, (&keys, &values), valid, scale);
                assert_eq!(ours.shape(), q.shape());
                let gap = relative_gap(&floats(&ours), &theirs);
                eprintln!("{dtype:?} {hq}/{hkv}x{d}, {valid} of {capacity}: {gap:.2e}");
                assert!(
                    gap <= tolerance,
                    "{dtype:?} {hq}/{hkv}x{d} {valid}/{capacity}: {gap}"
                );
            }
        }
    }
    // Two queries: not the kernel's case.
    let q = normal(&[1, 4, 2, 256], 1.0, &k1, Dtype::Float32);
    let kv = normal(&[1, 1, 16, 256], 1.0, &k2, Dtype::Float32);
    let count = Array::from_slice(&[16], &[1]).unwrap();
    assert!(decode_attention(&q, &kv, &kv, &count, 0.1)
        .unwrap()
        .is_none());
}

/// The reference for the attention kernels, computed on the host in double
/// precision: each query head of `q` `[1, Hq, 1, D]` over the first `valid`
/// keys and values of its key/value head (`[1, Hkv, capacity, D]`), as
/// `[Hq · D]` in head order. (MLX's float32 attention on the GPU rounds
/// more: 3.5e-4 of the largest output here. And MLX's default device is one
/// for the whole process, so a reference on MLX's CPU would move the tests
/// running beside this one off the GPU.)
fn host_attention(q: &Array, (keys, values): (&Array, &Array), valid: i32, scale: f32) -> Vec<f32> {
    let (hq, d) = (q.shape()[1] as usize, q.shape()[3] as usize);
    let (hkv, capacity) = (keys.shape()[1] as usize, keys.shape()[2] as usize);
    let (q, k, v) = (floats(q), floats(keys), floats(values));
    let mut out = Vec::with_capacity(hq * d);
    for h in 0..hq {
        let start = |j: usize| (h / (hq / hkv) * capacity + j) * d;
        let query = &q[h * d..(h + 1) * d];
        let scores: Vec<f64> = (0..valid as usize)
            .map(|j| {
                let key = &k[start(j)..start(j) + d];
                let dot: f64 = query
                    .iter()
                    .zip(key)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                dot * f64::from(scale)
            })
            .collect();
        let top = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
        let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
        let total: f64 = weights.iter().sum();
        for e in 0..d {
            let sum: f64 = weights
                .iter()
                .enumerate()
                .map(|(j, w)| w * f64::from(v[start(j) + e]))
                .sum();
            out.push((sum / total) as f32);
        }
    }
    out
}

#[test]
fn stored_decode_attention_kernel_reads_every_store_as_its_decoded_vectors() {
    if !on_gpu() {
        return;
    }
    let key = random::key(16).unwrap();
    let (k1, k2) = random::split(&key).unwrap();
    let k3 = random::split(&k2).unwrap().0;
    let t = |bits| KvFormat::Turbo { bits };
    let a = |bits, group_size| KvFormat::Quantized { bits, group_size };
    let f = KvFormat::Float(None);
    let turbo = |format: KvFormat| matches!(format, KvFormat::Turbo { .. });
    let mixes = [
        (t(4), t(4)),
        (t(3), f),
        (f, t(2)),
        (t(2), t(3)),
        (a(8, 64), a(8, 64)),
        (a(4, 32), f),
        (a(3, 128), a(5, 32)),
        (a(6, 64), t(4)),
        (t(3), a(2, 64)),
    ];
    for (dtype, tolerance) in [(Dtype::Float32, 1e-5), (Dtype::Bfloat16, 1e-2)] {
        for (hq, hkv, d) in [(4, 1, 256), (32, 16, 128)] {
            for (kf, vf) in mixes {
                let (capacity, valid) = (512, 300);
                let q = normal(&[1, hq, 1, d], 1.0, &k1, dtype);
                let store = |format: KvFormat, k: &Array| {
                    KvStore::encode(&normal(&[1, hkv, capacity, d], 1.0, k, dtype), format).unwrap()
                };
                let (keys, values) = (store(kf, &k2), store(vf, &k3));
                let count = Array::from_slice(&[valid], &[1]).unwrap();
                let scale = 1.0 / (d as f32).sqrt();
                // The kernel works in the rotated domain.
                let rotated = if turbo(kf) {
                    rotate(&q).unwrap()
                } else {
                    q.clone()
                };
                let out = decode_attention_stored(&rotated, &keys, &values, &count, scale)
                    .unwrap()
                    .expect("the kernel takes these stores");
                let ours = if turbo(vf) {
                    unrotate(&out).unwrap()
                } else {
                    out
                };
                // Over the decoded, un-rotated vectors.
                let decoded = |s: &KvStore| s.decoded(Dtype::Float32).unwrap();
                let theirs = host_attention(&q, (&decoded(&keys), &decoded(&values)), valid, scale);
                let gap = relative_gap(&floats(&ours), &theirs);
                eprintln!("{dtype:?} {hq}/{hkv}x{d} {kf:?}/{vf:?}: {gap:.2e}");
                assert!(
                    gap <= tolerance,
                    "{dtype:?} {hq}/{hkv}x{d} {kf:?}/{vf:?}: {gap}"
                );
            }
        }
    }
}

/// MLX's CUDA `quantized_matmul` broadcast over grouped-query heads gave
/// outputs 1.4× the output's size away from these on the H200 (more than one
/// key/value head; MLX 0.32.4), so eager attention dequantizes affine caches.
#[test]
fn eager_attention_over_affine_caches_gives_the_attention_of_the_decoded_vectors() {
    if !on_gpu() {
        return;
    }
    let key = random::key(17).unwrap();
    let (k1, k2) = random::split(&key).unwrap();
    let k3 = random::split(&k2).unwrap().0;
    let a = |bits, group_size| KvFormat::Quantized { bits, group_size };
    let mut worst = Vec::new();
    // 1B's heads (4 over 1 of 256), 4B's (8 over 4 of 256), 27B's (32 over
    // 16 of 128): one query over 256 keys.
    for (hq, hkv, d) in [(4, 1, 256), (8, 4, 256), (32, 16, 128)] {
        for format in [a(8, 32), a(4, 64)] {
            let n = 256;
            let q = normal(&[1, hq, 1, d], 1.0, &k1, Dtype::Bfloat16);
            let store = |k: &Array| {
                KvStore::encode(&normal(&[1, hkv, n, d], 1.0, k, Dtype::Bfloat16), format).unwrap()
            };
            let attend = Attend {
                keys: store(&k2),
                values: store(&k3),
                mask: KeyMask::All,
                queries: QueryRounding::Exact,
                rotation: Rotation::NONE,
            };
            let scale = 1.0 / (d as f32).sqrt();
            let ours = cache_attention(&q, &attend, scale, false).unwrap();
            let decoded = |s: &KvStore| s.decoded(Dtype::Float32).unwrap();
            let theirs = host_attention(
                &q,
                (&decoded(&attend.keys), &decoded(&attend.values)),
                n,
                scale,
            );
            let gap = relative_gap(&floats(&ours), &theirs);
            eprintln!("{hq}/{hkv}x{d} {format:?}: {gap:.2e}");
            worst.push((gap, format!("{hq}/{hkv}x{d} {format:?}")));
        }
    }
    for (gap, case) in worst {
        assert!(gap <= 1e-2, "{case}: {gap}");
    }
}

fn two_layers_of(size: &str) -> Gemma3 {
    let config = Gemma3Config::published(size, Some(2)).unwrap();
    random_model(config, Dtype::Bfloat16, 5)
}

/// Logits of a 9-token prefill and 3 single-token steps over caches of
/// `formats`, eager or through the compiled fixed-shape step.
fn logits(model: &Gemma3, compiled: bool, formats: impl Into<LayerFormats>) -> Vec<f32> {
    let mut caches = model.make_caches(formats).unwrap();
    let prompt: Vec<i32> = (0..9).map(|i| 100 + 37 * i).collect();
    let mut out = floats(
        &model
            .forward(&Array::from_slice(&prompt, &[1, 9]).unwrap(), &mut caches)
            .unwrap(),
    );
    let step = DecodeStep::new(model, true).unwrap();
    if compiled {
        assert!(step.reserve(&mut caches, 12).unwrap());
    }
    for t in [7, 11, 13] {
        let token = Array::from_slice(&[t], &[1, 1]).unwrap();
        let logits = if compiled {
            step.forward(&token, &mut caches).unwrap()
        } else {
            model.forward(&token, &mut caches).unwrap()
        };
        out.extend(floats(&logits));
    }
    out
}

#[test]
fn the_model_with_fused_kernels_gives_the_same_logits() {
    if !on_gpu() {
        return;
    }
    let mut model = two_layers_of("1b");
    let plain = logits(&model, false, CacheFormat::COMPUTE);
    model.gpu_kernels = true;
    let fused = logits(&model, false, CacheFormat::COMPUTE);
    let gap = relative_gap(&fused, &plain);
    eprintln!("1B shape, 2 layers, bfloat16: largest logit gap {gap:.2e} of the largest logit");
    assert!(gap < 2e-2, "{gap}");
}

#[test]
fn the_compiled_decode_step_gives_the_same_logits_on_the_gpu() {
    if !on_gpu() {
        return;
    }
    // 1B: one query head per attention block; 27B, the real shape of the
    // largest size: both query heads of a key/value pair in one block, and
    // projections of more rows than the grid has warps. Float caches, q8_0
    // ones and TurboQuant keys with affine 4-bit values.
    let formats = [
        ("float", CacheFormat::COMPUTE),
        (
            "q8_0",
            CacheFormat {
                keys: KvFormat::Quantized {
                    bits: 8,
                    group_size: 32,
                },
                values: KvFormat::Quantized {
                    bits: 8,
                    group_size: 32,
                },
                ..CacheFormat::COMPUTE
            },
        ),
        (
            "turbo4/q4_0",
            CacheFormat {
                keys: KvFormat::Turbo { bits: 4 },
                values: KvFormat::Quantized {
                    bits: 4,
                    group_size: 32,
                },
                ..CacheFormat::COMPUTE
            },
        ),
    ];
    let mut gaps = Vec::new();
    for size in ["1b", "27b"] {
        for (name, format) in formats {
            let mut model = two_layers_of(size);
            let plain = logits(&model, false, format);
            for kernels in [false, true] {
                model.gpu_kernels = kernels;
                let compiled = logits(&model, true, format);
                let gap = relative_gap(&compiled, &plain);
                eprintln!(
                    "{size}, {name}, compiled step, kernels {kernels}: largest logit gap {gap:.2e}"
                );
                gaps.push((gap, format!("{size}, {name}, kernels {kernels}")));
            }
        }
    }
    for (gap, case) in gaps {
        assert!(gap < 2e-2, "{case}: {gap}");
    }
}

#[test]
fn each_layer_keeps_its_policys_format_in_the_fused_kernel_and_rotation_is_exact() {
    if !on_gpu() {
        return;
    }
    let a = |bits| KvFormat::Quantized {
        bits,
        group_size: 32,
    };
    let t = |bits| KvFormat::Turbo { bits };
    let per_layer = LayerFormats::PerLayer(vec![
        CacheFormat {
            keys: a(8),
            values: t(4),
            ..CacheFormat::COMPUTE
        },
        CacheFormat {
            keys: t(3),
            values: a(4),
            ..CacheFormat::COMPUTE
        },
    ]);
    let both = Rotation {
        keys: true,
        values: true,
    };
    let rotated = CacheFormat {
        rotation: both,
        ..CacheFormat::COMPUTE
    };
    let mut gaps = Vec::new();
    for size in ["1b", "27b"] {
        let mut model = two_layers_of(size);
        let eager = logits(&model, false, per_layer.clone());
        let float = logits(&model, false, CacheFormat::COMPUTE);
        model.gpu_kernels = true;
        let fused = logits(&model, true, per_layer.clone());
        gaps.push((
            relative_gap(&fused, &eager),
            format!("{size}, per-layer, fused"),
        ));
        // A rotated float cache decodes eagerly (not reserved for the
        // step), with and without our attention kernels.
        for kernels in [false, true] {
            model.gpu_kernels = kernels;
            let r = logits(&model, false, rotated);
            gaps.push((
                relative_gap(&r, &float),
                format!("{size}, rotated float, kernels {kernels}"),
            ));
        }
    }
    for (gap, case) in gaps {
        eprintln!("{case}: largest logit gap {gap:.2e}");
        assert!(gap < 2e-2, "{case}: {gap}");
    }
}

/// Whether [`decode_layer`] takes the first block of `model` over caches
/// of `format` (so that the fixed-shape step runs every block through it
/// rather than falling back).
fn layer_kernel_takes(model: &Gemma3, format: CacheFormat) -> bool {
    let c = &model.config;
    let geometry = model.layer_geometry(0);
    let Some(weights) = LayerWeights::of(&model.layers[0], geometry, model.dtype).unwrap() else {
        return false;
    };
    let (hkv, d) = (c.num_key_value_heads as i32, c.head_dim as i32);
    let buffer = |f: KvFormat| {
        let zeros = mlx_core::zeros(&[1, hkv, 256, d], model.dtype).unwrap();
        KvStore::encode(&zeros, f).unwrap()
    };
    let (keys, values) = (buffer(format.keys), buffer(format.values));
    let position = Array::from_slice(&[3], &[1]).unwrap();
    let valid = Array::from_slice(&[4], &[1]).unwrap();
    let x = normal(
        &[1, 1, c.hidden_size as i32],
        1.0,
        &random::key(1).unwrap(),
        model.dtype,
    );
    let kv = LayerKv {
        keys: &keys,
        values: &values,
        position: &position,
        write_at: &position,
        valid: &valid,
    };
    let barrier = grid_barrier().unwrap();
    let blocks = resident_blocks().unwrap();
    let out = decode_layer(&x, &weights, &kv, model.layer_geometry(0), &barrier, blocks).unwrap();
    out.map(|o| floats(&o).iter().all(|v| v.is_finite()))
        .unwrap_or(false)
}

#[test]
fn fused_layer_kernels_give_the_logits_of_the_eager_pass() {
    if !on_gpu() {
        return;
    }
    eprintln!("{} resident blocks", resident_blocks().unwrap());
    // The tiny float32 model: 4 query and 2 key/value heads of 64, so each
    // head's keys are split over many blocks, most of them empty at first.
    // Logits span about ±20. MLX's own fixed-shape step (no kernels of
    // ours) is printed beside as the spread of GPU summation orders.
    for window in [8, 300] {
        let mut model = tiny_model(window);
        let reference = eager(&model);
        let (plain, _) = mixed(&model, true);
        model.gpu_kernels = true;
        assert!(layer_kernel_takes(&model, CacheFormat::COMPUTE));
        for compiled in [false, true] {
            let (logits, _) = mixed(&model, compiled);
            let d = max_diff(&reference, &logits);
            let spread = max_diff(&reference, &plain);
            eprintln!(
                "window {window}, compiled {compiled}: max |Δ logit| {d:e} (MLX's step: {spread:e})"
            );
            assert!(d < 5e-3, "window {window}, compiled {compiled}: {d}");
        }
    }
    let model = two_layers_of("1b");
    assert!(layer_kernel_takes(&model, CacheFormat::COMPUTE));
}

#[test]
fn fused_layer_kernels_encode_and_read_every_cache_format_as_the_eager_pass() {
    if !on_gpu() {
        return;
    }
    let a = |bits, group_size| KvFormat::Quantized { bits, group_size };
    let t = |bits| KvFormat::Turbo { bits };
    let f = KvFormat::Float(None);
    let format = |keys, values| CacheFormat {
        keys,
        values,
        ..CacheFormat::COMPUTE
    };
    // (name, head size, format, tokens kept in floats first). The kernel's
    // Walsh–Hadamard rotation sums in another order than MLX's, so a rotated
    // coordinate within rounding of a codebook boundary can take the
    // neighbouring centroid: one codebook step in one coordinate, whose
    // effect on the logits depends on which coordinate flips, not only on
    // the bit width (H200, 2026-12-02: turbo4/turbo4 4.8e-3, float/turbo4
    // 7.4e-3, turbo2 8.1e-3, against at most 1.5e-3 for the affine formats,
    // which round the same values the same way).
    let cases = [
        ("q8_0/q8_0", 64, format(a(8, 64), a(8, 64)), 0),
        (
            "q8_0/q8_0, heads of 256",
            256,
            format(a(8, 32), a(8, 32)),
            0,
        ),
        ("q4/float, group 32", 64, format(a(4, 32), f), 0),
        // Codes read as whole 16- and 32-bit words and decoded where used.
        ("q2/q4, heads of 256", 256, format(a(2, 32), a(4, 128)), 0),
        ("q4/q4, heads of 128", 128, format(a(4, 32), a(4, 64)), 0),
        (
            "q3/q6 after 3 float tokens",
            64,
            format(a(3, 64), a(6, 64)),
            3,
        ),
        (
            "q2/q5, groups 128 and 32",
            128,
            format(a(2, 128), a(5, 32)),
            0,
        ),
        ("turbo4/turbo4", 128, format(t(4), t(4)), 0),
        ("q8_0/turbo3", 256, format(a(8, 64), t(3)), 0),
        ("turbo2/float after 5", 128, format(t(2), f), 5),
        ("float/turbo4", 128, format(f, t(4)), 0),
    ];
    let tolerance = |format: CacheFormat| {
        let turbo = |side| matches!(side, KvFormat::Turbo { .. });
        if turbo(format.keys) || turbo(format.values) {
            2e-2
        } else {
            5e-3
        }
    };
    for window in [8, 300] {
        for (name, head_dim, format, start) in cases {
            let mut model = tiny_model_with_heads(window, head_dim);
            let (reference, _) = scheduled(&model, format, start, Steps::Eager);
            model.gpu_kernels = true;
            assert!(layer_kernel_takes(&model, format), "{name}");
            let (fused, _) = scheduled(&model, format, start, Steps::Fixed { compiled: true });
            let d = max_diff(&reference, &fused);
            eprintln!("window {window}, {name}: max |Δ logit| {d:e}");
            assert!(d < tolerance(format), "window {window}, {name}: {d}");
        }
    }
}

/// A logit bias: (token id, bias) pairs.
type Bias = Vec<(u32, f32)>;

/// The greedy pick of `logits` plus `bias` computed on the host: the first
/// id of the largest biased value, and whether every logit is finite.
fn host_pick(logits: &[f32], bias: &[(u32, f32)]) -> (u32, bool) {
    let mut biased = logits.to_vec();
    for &(id, b) in bias {
        biased[id as usize] += b;
    }
    let best = biased
        .iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |(at, m), (i, &v)| {
                if v > m {
                    (i, v)
                } else {
                    (at, m)
                }
            },
        );
    (best.0 as u32, logits.iter().all(|v| v.is_finite()))
}

#[test]
fn greedy_pick_kernel_matches_mlx_argmax() {
    if !on_gpu() {
        return;
    }
    let vocab = 262_144;
    // Logits on a grid of quarters from -10 to 10: the largest value is
    // held by many ids, so the ties are exercised (the lowest id wins).
    let mut state = 0x2545_f491_u32;
    let grid: Vec<f32> = (0..vocab)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((state >> 8) % 81) as f32 / 4.0 - 10.0
        })
        .collect();
    let top = grid.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let tied: Vec<u32> = (0..vocab as u32)
        .filter(|&i| grid[i as usize] == top)
        .collect();
    assert!(
        tied.len() > 100,
        "{} ids hold the largest logit",
        tied.len()
    );
    let mut with_inf = grid.clone();
    with_inf[7] = f32::INFINITY;
    let mut with_nan = grid.clone();
    with_nan[vocab as usize - 1] = f32::NAN;
    let cases: [(&str, &[f32], Bias); 6] = [
        ("no bias", &grid, vec![]),
        ("the first tied id banned", &grid, vec![(tied[0], -1e30)]),
        (
            "the first two banned, a later tie biased by 0",
            &grid,
            vec![(tied[0], -1e30), (tied[1], -1e30), (tied[5], 0.0)],
        ),
        ("a low logit lifted to the top", &grid, vec![(3, 40.0)]),
        ("an infinite logit", &with_inf, vec![(1, -1e30)]),
        ("a NaN logit", &with_nan, vec![]),
    ];
    for dtype in [Dtype::Bfloat16, Dtype::Float32] {
        for (name, values, bias) in &cases {
            let logits = Array::from_slice(values, &[1, vocab])
                .unwrap()
                .astype(dtype)
                .unwrap();
            let pick = gemma::cuda::GreedyPick::new(vocab, bias)
                .unwrap()
                .expect("distinct ids inside the vocabulary");
            let picked = pick
                .pick(&logits)
                .unwrap()
                .expect("a 262,144-entry row suits the kernel")
                .to_vec::<u32>()
                .unwrap();
            let (id, finite) = host_pick(&floats(&logits), bias);
            assert_eq!(picked[1] != 0, finite, "{dtype:?}, {name}: finiteness");
            if !finite {
                continue;
            }
            let mut dense = vec![0f32; vocab as usize];
            for &(i, b) in bias {
                dense[i as usize] = b;
            }
            let mlx = logits
                .astype(Dtype::Float32)
                .unwrap()
                .add(&Array::from_slice(&dense, &[1, vocab]).unwrap())
                .unwrap()
                .argmax(-1, false)
                .unwrap()
                .astype(Dtype::Uint32)
                .unwrap()
                .to_vec::<u32>()
                .unwrap();
            eprintln!(
                "{dtype:?}, {name}: kernel {}, host {id}, MLX {}",
                picked[0], mlx[0]
            );
            assert_eq!(picked[0], id, "{dtype:?}, {name}: against the host");
            assert_eq!(picked[0], mlx[0], "{dtype:?}, {name}: against MLX");
        }
    }
}
