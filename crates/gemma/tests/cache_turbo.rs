//! TurboQuant caches (`turbo2/3/4`): our encoder against the numpy reference
//! written from the format's description (`tests/turbo/reference.py`), on
//! random vectors and on real key/value rows of the default model; the
//! format's mean squared error; attention over TurboQuant keys and values
//! (rotated queries, output rotated back) against attention over the
//! explicitly decoded vectors on every cache path, on the CPU and (where
//! MLX has one) the GPU; the bytes a cache reports; and the errors.

mod common;

use std::path::Path;
use std::process::Command;

use common::mlx_lm::python;
use common::models::{corpus_text, random_model, tiny_config, with_default_model};
use common::serial;
use gemma::cache::turbo::{codebook, midpoints, TurboArray};
use gemma::cache::{
    Attend, CacheFormat, KvCache, KvFormat, KvStore, LayerCache, RotatingKvCache, STEP,
};
use gemma::forward::cache_attention;
use mlx_core::device::{is_available, set_default_device};
use mlx_core::{random, Array, Device, Dtype};
use serde_json::Value;

const BITS: [i32; 3] = [2, 3, 4];

/// Standard normal `[n, 128]` float32 vectors from `seed`.
fn standard_normal(n: i32, seed: u64) -> Array {
    let key = random::key(seed).expect("key");
    random::normal(&[n, 128], Dtype::Float32, 0.0, 1.0, Some(&key)).expect("normal")
}

fn floats(a: &Array) -> Vec<f32> {
    a.astype(Dtype::Float32)
        .and_then(|a| a.to_vec::<f32>())
        .expect("floats")
}

/// What the reference encoder gives for rows of 128 values.
struct Reference {
    indices: Vec<u8>,
    norms: Vec<u16>,
    /// The norms before their rounding to float16.
    norms_f32: Vec<f32>,
    rotated: Vec<f32>,
}

fn run_reference(python: &Path, bits: i32, rows: &[f32]) -> Reference {
    let dir = tempfile::tempdir().expect("temporary directory");
    let input = dir.path().join("rows.f32");
    let output = dir.path().join("encoded.json");
    let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&input, bytes).expect("write the rows");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/turbo/reference.py");
    let status = Command::new(python)
        .arg(&script)
        .arg(bits.to_string())
        .arg(&input)
        .arg(&output)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    assert!(status.success(), "{} failed", script.display());
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(&output).expect("read")).expect("json");
    let flat = |key: &str| -> Vec<f64> {
        json[key]
            .as_array()
            .expect("array")
            .iter()
            .flat_map(|v| match v.as_array() {
                Some(row) => row.iter().map(|x| x.as_f64().expect("number")).collect(),
                None => vec![v.as_f64().expect("number")],
            })
            .collect()
    };
    Reference {
        indices: flat("indices").into_iter().map(|v| v as u8).collect(),
        norms: flat("norms").into_iter().map(|v| v as u16).collect(),
        norms_f32: flat("norms_f32").into_iter().map(|v| v as f32).collect(),
        rotated: flat("rotated").into_iter().map(|v| v as f32).collect(),
    }
}

/// Our indices and float16 norm bits for rows of 128 values.
fn encode_rows(rows: &[f32], bits: i32) -> (Vec<u8>, Vec<u16>) {
    let n = (rows.len() / 128) as i32;
    let t = TurboArray::encode(&Array::from_slice(rows, &[n, 128]).expect("rows"), bits)
        .expect("encode");
    let indices = t
        .indices()
        .and_then(|i| Ok(i.to_vec::<u8>()?))
        .expect("idx");
    let norms = t.norms.to_vec::<half::f16>().expect("norms");
    (indices, norms.into_iter().map(half::f16::to_bits).collect())
}

/// Whether a float32 value lies within a relative 1e-6 of the midpoint
/// between two float16 values (where the order of a sum's float32 additions
/// decides which way it rounds).
fn near_half_rounding_edge(v: f32) -> bool {
    half::f16::from_f32(v * (1.0 + 1e-6)) != half::f16::from_f32(v * (1.0 - 1e-6))
}

/// Asserts our encoding equals the reference's: every index, except where
/// the reference's rotated value lies within 1e-6 of a midpoint (float32
/// rounding order decides there; such an index may differ by one), and
/// every norm, except where the reference's float32 norm lies that close to
/// a float16 rounding edge (one float16 step apart at most there). Returns
/// how many indices and norms differ.
fn assert_matches_reference(python: &Path, rows: &[f32], bits: i32, what: &str) -> (usize, usize) {
    let reference = run_reference(python, bits, rows);
    let (indices, norms) = encode_rows(rows, bits);
    assert_eq!(indices.len(), reference.indices.len());
    let mids = midpoints(bits);
    let mut index_differences = 0;
    for (j, (&ours, &theirs)) in indices.iter().zip(&reference.indices).enumerate() {
        let y = reference.rotated[j];
        let on_edge = mids.iter().any(|m| (y - m).abs() < 1e-6);
        if ours != theirs {
            index_differences += 1;
            assert!(
                on_edge && ours.abs_diff(theirs) == 1,
                "{what}, turbo{bits}: value {j} (row {}, rotated {y}) has index {ours}, \
                 the reference {theirs}",
                j / 128
            );
        }
    }
    let mut norm_differences = 0;
    for (row, (&ours, &theirs)) in norms.iter().zip(&reference.norms).enumerate() {
        let on_edge = near_half_rounding_edge(reference.norms_f32[row]);
        norm_differences += usize::from(ours != theirs);
        assert!(
            ours == theirs || (on_edge && ours.abs_diff(theirs) == 1),
            "{what}, turbo{bits}: row {row} has norm {} (bits {ours:#06x}), the reference {} \
             ({theirs:#06x})",
            half::f16::from_bits(ours),
            half::f16::from_bits(theirs)
        );
    }
    (index_differences, norm_differences)
}

#[test]
fn indices_and_norms_equal_the_reference_on_random_vectors() {
    let Some(python) = python() else { return };
    let _mlx = serial();
    // Rows of very different lengths, a zero row and an axis-aligned one.
    let scale_key = random::key(8).expect("key");
    let scales =
        random::uniform(0.01, 50.0, &[2048, 1], Dtype::Float32, Some(&scale_key)).expect("uniform");
    let rows = standard_normal(2048, 7).multiply(&scales).expect("scale");
    let mut rows = floats(&rows);
    rows[..128].fill(0.0);
    rows[128..256].fill(0.0);
    rows[128 + 5] = -4.0;
    for bits in BITS {
        let (indices, norms) = assert_matches_reference(&python, &rows, bits, "random rows");
        println!(
            "turbo{bits}, 2048 random rows: {indices} of 262144 indices and {norms} of 2048 \
             norms differ from the reference, each on a rounding edge"
        );
    }
}

#[test]
fn indices_and_norms_equal_the_reference_on_the_default_models_keys_and_values() {
    let Some(python) = python() else { return };
    with_default_model(false, |m| {
        let text = corpus_text();
        let ids = m.tokenizer.encode(&text, true).expect("encode");
        let ids: Vec<i32> = ids[..96].iter().map(|&t| t as i32).collect();
        let tokens = Array::from_slice(&ids, &[1, 96]).expect("tokens");
        let mut caches = m.model.make_caches(CacheFormat::COMPUTE).expect("caches");
        let logits = m.model.forward(&tokens, &mut caches).expect("forward");
        logits.eval().expect("eval");
        // Layer 0 is a sliding layer, layer 5 the first global one.
        for layer in [0, 5] {
            let arrays = caches[layer].arrays();
            for (what, stored) in ["keys", "values"].iter().zip(arrays) {
                let shape = stored.shape();
                let rows = stored
                    .slice(&[0, 0, 0, 0], &[1, shape[1], 96, shape[3]], &[1, 1, 1, 1])
                    .expect("slice");
                let rows = floats(&rows);
                for bits in BITS {
                    let label = format!("layer {layer} {what}");
                    let (indices, norms) = assert_matches_reference(&python, &rows, bits, &label);
                    println!(
                        "turbo{bits}, {label}, {} rows: {indices} indices and {norms} norms \
                         differ from the reference, each on a rounding edge",
                        rows.len() / 128
                    );
                }
            }
        }
    });
}

#[test]
fn mean_relative_error_matches_the_formats_figures() {
    let _mlx = serial();
    let x = standard_normal(20_000, 11);
    let energy = x
        .square()
        .and_then(|e| e.sum(&[-1], false))
        .expect("energy");
    for (bits, expected) in [(2, 0.119), (3, 0.0339), (4, 0.0181)] {
        let decoded = TurboArray::encode(&x, bits)
            .and_then(|t| t.decode(Dtype::Float32))
            .expect("round trip");
        let error = x
            .subtract(&decoded)
            .and_then(|d| d.square())
            .and_then(|d| d.sum(&[-1], false))
            .and_then(|d| d.divide(&energy))
            .and_then(|r| r.mean_all())
            .and_then(|r| r.item::<f32>())
            .expect("error") as f64;
        println!("turbo{bits}: mean relative squared error {error:.5} (format: {expected})");
        assert!(
            (error - expected).abs() <= 0.03 * expected,
            "turbo{bits}: {error} is not within 3 % of {expected}"
        );
    }
}

/// Random `[1, heads, n, 128·groups]` vectors.
fn vectors(heads: i32, n: i32, dim: i32, key: &Array, dtype: Dtype) -> Array {
    random::normal(&[1, heads, n, dim], Dtype::Float32, 0.0, 1.0, Some(key))
        .and_then(|a| a.astype(dtype))
        .expect("vectors")
}

/// The same attend with every TurboQuant store decoded back to the
/// original (un-rotated) domain.
fn decoded(attend: &Attend, dtype: Dtype) -> Attend {
    let plain = |s: &KvStore| match s {
        KvStore::Turbo(t) => KvStore::Float(t.decode(dtype).expect("decode")),
        other => other.clone(),
    };
    Attend {
        keys: plain(&attend.keys),
        values: plain(&attend.values),
        mask: attend.mask.clone(),
        queries: attend.queries,
        rotation: attend.rotation,
    }
}

/// Feeds a cache a schedule of chunks (prefill chunks and single tokens,
/// past the window for a rotating cache) and compares, at every step,
/// attention over what it returns with attention over the same vectors
/// decoded back explicitly. Returns the largest difference.
fn largest_gap(mut cache: LayerCache, dtype: Dtype, gpu_kernels: bool) -> f32 {
    let (hq, hkv, dim) = (4, 2, 256);
    let mut key = random::key(5).expect("key");
    let mut worst = 0.0f32;
    for n in [6, 1, 1, 5, 1, 7, 1, 1] {
        let (k1, rest) = random::split(&key).expect("split");
        let (k2, k3) = random::split(&rest).expect("split");
        key = k3.clone();
        let q = vectors(hq, n, dim, &k1, dtype);
        let k = vectors(hkv, n, dim, &k2, dtype);
        let v = vectors(hkv, n, dim, &k3, dtype);
        let attend = cache.update_and_fetch(&k, &v).expect("update");
        let ours = cache_attention(&q, &attend, 0.0625, gpu_kernels).expect("attention");
        let reference = cache_attention(&q, &decoded(&attend, dtype), 0.0625, gpu_kernels)
            .expect("reference attention");
        let gap = floats(&ours)
            .iter()
            .zip(floats(&reference))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        worst = worst.max(gap);
    }
    worst
}

/// Key/value format pairs with a TurboQuant side: symmetric, one side
/// alone, and mixed with affine quantization.
fn turbo_mixes() -> Vec<(&'static str, CacheFormat)> {
    let t = |bits| KvFormat::Turbo { bits };
    let q = |bits| KvFormat::Quantized {
        bits,
        group_size: 64,
    };
    let f = KvFormat::Float(None);
    vec![
        (
            "turbo2/turbo2",
            CacheFormat {
                keys: t(2),
                values: t(2),
                ..CacheFormat::COMPUTE
            },
        ),
        (
            "turbo3/turbo3",
            CacheFormat {
                keys: t(3),
                values: t(3),
                ..CacheFormat::COMPUTE
            },
        ),
        (
            "turbo4/float",
            CacheFormat {
                keys: t(4),
                values: f,
                ..CacheFormat::COMPUTE
            },
        ),
        (
            "float/turbo4",
            CacheFormat {
                keys: f,
                values: t(4),
                ..CacheFormat::COMPUTE
            },
        ),
        (
            "q8/turbo3",
            CacheFormat {
                keys: q(8),
                values: t(3),
                ..CacheFormat::COMPUTE
            },
        ),
        (
            "turbo4/q4",
            CacheFormat {
                keys: t(4),
                values: q(4),
                ..CacheFormat::COMPUTE
            },
        ),
    ]
}

/// Both cache kinds of every mix, quantizing from the start and from token 8.
fn every_cache() -> Vec<(String, LayerCache)> {
    let mut out = Vec::new();
    for (name, format) in turbo_mixes() {
        for start in [0, 8] {
            let plain = LayerCache::Plain(KvCache::new(format)).quantize_from(start);
            let window = RotatingKvCache::new(9, format).expect("rotating cache");
            let rotating = LayerCache::Rotating(window).quantize_from(start);
            out.push((format!("{name}, global, start={start}"), plain));
            out.push((format!("{name}, sliding 9, start={start}"), rotating));
        }
    }
    out
}

#[test]
fn attention_over_turbo_stores_equals_attention_over_decoded_vectors_on_the_cpu() {
    let _mlx = serial();
    set_default_device(Device::Cpu).expect("cpu");
    for (name, cache) in every_cache() {
        let gap = largest_gap(cache, Dtype::Float32, false);
        assert!(gap < 2e-5, "{name}: largest gap {gap}");
    }
}

#[test]
fn attention_over_turbo_stores_equals_attention_over_decoded_vectors_on_the_gpu() {
    let _mlx = serial();
    if !is_available(Device::Gpu).expect("device query") {
        eprintln!("no GPU in this MLX build: this test runs on the GPU machine");
        return;
    }
    set_default_device(Device::Gpu).expect("gpu");
    for kernels in [false, true] {
        for (name, cache) in every_cache() {
            let gap = largest_gap(cache, Dtype::Bfloat16, kernels);
            println!("GPU, kernels {kernels}, {name}: largest gap {gap}");
            assert!(
                gap < 0.05,
                "GPU, kernels {kernels}, {name}: largest gap {gap}"
            );
        }
    }
    set_default_device(Device::Cpu).expect("cpu");
}

#[test]
fn a_cache_reports_its_packed_bytes() {
    let _mlx = serial();
    for (bits, per_group) in [(2, 34), (3, 50), (4, 66)] {
        assert_eq!(
            KvFormat::Turbo { bits }.bytes_per_vector(256, Dtype::Float32),
            2 * per_group
        );
    }
    let format = CacheFormat {
        keys: KvFormat::Turbo { bits: 3 },
        values: KvFormat::Turbo { bits: 4 },
        ..CacheFormat::COMPUTE
    };
    let mut cache = LayerCache::Plain(KvCache::new(format));
    let key = random::key(3).expect("key");
    let kv = vectors(2, 10, 256, &key, Dtype::Float32);
    cache.update_and_fetch(&kv, &kv).expect("update");
    // One step of positions, 2 heads, 2 groups of 50 + 66 bytes.
    assert_eq!(cache.nbytes(), STEP as usize * 2 * 2 * (50 + 66));
}

#[test]
fn head_sizes_that_are_not_whole_groups_are_refused() {
    let _mlx = serial();
    // The tiny model's heads have 64 values.
    let model = random_model(tiny_config(2), Dtype::Float32, 1);
    let format = CacheFormat {
        keys: KvFormat::Float(None),
        values: KvFormat::Turbo { bits: 3 },
        ..CacheFormat::COMPUTE
    };
    let e = model.make_caches(format).unwrap_err().to_string();
    assert!(
        e.contains("64") && e.contains("128") && e.contains("turbo3"),
        "{e}"
    );
    let bad = KvFormat::Turbo { bits: 5 }
        .validate(256)
        .unwrap_err()
        .to_string();
    assert!(bad.contains("turbo5") && bad.contains("turbo4"), "{bad}");
}

#[test]
fn codebook_and_midpoints_are_the_published_ones() {
    assert_eq!(codebook(2), vec![-0.133462, -0.039994, 0.039994, 0.133462]);
    assert_eq!(midpoints(2), vec![-0.086728, 0.0, 0.086728]);
    assert_eq!(codebook(4).len(), 16);
    assert_eq!(midpoints(3)[6], 0.154259);
}
