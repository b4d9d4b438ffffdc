//! Storage formats of both cache kinds: float casts on insert, every MLX
//! affine quantization (bits 2, 3, 4, 5, 6, 8 × groups 32, 64, 128), every
//! ggml block format (the quantizer's bytes, vector by vector), asymmetric
//! key/value formats, format validation, and the bytes a cache holds
//! against the per-vector formula.

use gemma::cache::{
    block, Attend, CacheFormat, KvCache, KvFormat, KvStore, LayerCache, RotatingKvCache,
};
use gemma::quant::{quantize_into, GgufDtype, QUANTIZABLE};
use mlx_core::{Array, Dtype};

const BATCH: i32 = 2;
const HEADS: i32 = 2;
const DIM: i32 = 128;
/// A window larger than every schedule below, so that returned row r holds
/// position r in both cache kinds.
const WIDE_WINDOW: i32 = 64;

/// Deterministic pseudo-random floats in [-2, 2).
fn noise(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 22) as f32 - 2.0
        })
        .collect()
}

/// Per position, the `[BATCH][HEADS][DIM]` vectors written there.
type Rows = Vec<Vec<f32>>;

/// `n` random positions, and the `[BATCH, HEADS, n, DIM]` array holding them.
fn random_rows(seed: u64, n: i32, dtype: Dtype) -> (Rows, Array) {
    let per = (BATCH * HEADS * DIM) as usize;
    let rows: Rows = (0..n).map(|p| noise(seed * 1000 + p as u64, per)).collect();
    let mut data = Vec::with_capacity(per * n as usize);
    for bh in 0..(BATCH * HEADS) as usize {
        for row in &rows {
            data.extend_from_slice(&row[bh * DIM as usize..(bh + 1) * DIM as usize]);
        }
    }
    let array = Array::from_slice(&data, &[BATCH, HEADS, n, DIM])
        .expect("array")
        .astype(dtype)
        .expect("astype");
    // What the array holds after the cast to `dtype`.
    let rounded = array
        .astype(Dtype::Float32)
        .expect("astype")
        .to_vec::<f32>()
        .expect("to_vec");
    let rows = (0..n as usize)
        .map(|p| {
            (0..(BATCH * HEADS) as usize)
                .flat_map(|bh| {
                    let start = (bh * n as usize + p) * DIM as usize;
                    rounded[start..start + DIM as usize].to_vec()
                })
                .collect()
        })
        .collect();
    (rows, array)
}

/// Host `[BATCH, HEADS, positions, DIM]` values of a store, dequantized.
fn host(store: &KvStore) -> Vec<f32> {
    store
        .decoded(Dtype::Float32)
        .expect("decode")
        .astype(Dtype::Float32)
        .expect("astype")
        .to_vec::<f32>()
        .expect("to_vec")
}

/// The largest error of a quantized store, in units of its group's step
/// `(max − min) / (2^bits − 1)` (plus rounding to the compute dtype), over
/// the first `rows.len()` positions; float stores must be exact.
fn check_store(
    store: &KvStore,
    format: KvFormat,
    compute: Dtype,
    rows: &Rows,
    context: &str,
) -> f32 {
    let positions = store.positions() as usize;
    let got = host(store);
    let d = DIM as usize;
    match (store, format) {
        (KvStore::Float(a), KvFormat::Float(dtype)) => {
            assert_eq!(
                a.dtype(),
                dtype.unwrap_or(compute),
                "{context}: stored dtype"
            );
            for (p, row) in rows.iter().enumerate() {
                for bh in 0..(BATCH * HEADS) as usize {
                    let stored = &got[(bh * positions + p) * d..(bh * positions + p + 1) * d];
                    let want: Vec<f32> = row[bh * d..(bh + 1) * d]
                        .iter()
                        .map(|&x| match dtype {
                            Some(Dtype::Bfloat16) => half::bf16::from_f32(x).to_f32(),
                            Some(Dtype::Float16) => half::f16::from_f32(x).to_f32(),
                            _ => x,
                        })
                        .collect();
                    assert_eq!(
                        stored,
                        &want[..],
                        "{context}: position {p}, batch·head {bh}"
                    );
                }
            }
            0.0
        }
        (KvStore::Quantized(q), KvFormat::Quantized { bits, group_size }) => {
            assert_eq!((q.bits, q.group_size), (bits, group_size), "{context}");
            let packed = q.packed.shape();
            assert_eq!(q.packed.dtype(), Dtype::Uint32, "{context}");
            assert_eq!(
                packed,
                vec![BATCH, HEADS, positions as i32, DIM * bits / 32],
                "{context}: packed shape"
            );
            let groups = vec![BATCH, HEADS, positions as i32, DIM / group_size];
            assert_eq!(q.scales.shape(), groups, "{context}: scales shape");
            assert_eq!(q.biases.shape(), groups, "{context}: biases shape");
            assert_eq!(q.scales.dtype(), compute, "{context}: scales dtype");
            let g = group_size as usize;
            let levels = ((1 << bits) - 1) as f32;
            let ulp = match compute {
                Dtype::Bfloat16 => 2f32.powi(-8),
                Dtype::Float16 => 2f32.powi(-11),
                _ => f32::EPSILON,
            };
            let mut worst = 0.0f32;
            for (p, row) in rows.iter().enumerate() {
                for bh in 0..(BATCH * HEADS) as usize {
                    for group in 0..d / g {
                        let want = &row[bh * d + group * g..bh * d + (group + 1) * g];
                        let at = (bh * positions + p) * d + group * g;
                        let stored = &got[at..at + g];
                        let (lo, hi) = want
                            .iter()
                            .fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
                        let step = (hi - lo) / levels;
                        // Scales, biases and the dequantized values are
                        // rounded to the compute dtype: two of its ulps of
                        // the group's magnitude on top of one step.
                        let slack = lo.abs().max(hi.abs()) * 2.0 * ulp;
                        for (s, w) in stored.iter().zip(want) {
                            worst = worst.max((s - w).abs() / (step + slack));
                        }
                    }
                }
            }
            assert!(worst <= 1.0, "{context}: an error of {worst} steps");
            worst
        }
        (KvStore::Block(b), KvFormat::Block(dtype)) => {
            assert_eq!(b.dtype, dtype, "{context}");
            let per_vector = (DIM / 32) as usize * dtype.type_size() as usize;
            let held = block::carrier(dtype);
            assert_eq!(b.bytes.dtype(), held, "{context}: block carrier");
            let elements = (per_vector / held.size_bytes()) as i32;
            let shape = vec![BATCH, HEADS, positions as i32, elements];
            assert_eq!(b.bytes.shape(), shape, "{context}: block shape");
            let got: Vec<u8> = if held == Dtype::Int16 {
                let values = b.bytes.to_vec::<i16>().expect("bytes");
                values.iter().flat_map(|v| v.to_le_bytes()).collect()
            } else {
                let values = b.bytes.to_vec::<i8>().expect("bytes");
                values.iter().map(|&v| v as u8).collect()
            };
            let d = DIM as usize;
            let mut want = vec![0u8; per_vector];
            for (p, row) in rows.iter().enumerate() {
                for bh in 0..(BATCH * HEADS) as usize {
                    quantize_into(dtype, &row[bh * d..(bh + 1) * d], &mut want).expect("quantize");
                    let at = (bh * positions + p) * per_vector;
                    assert!(
                        got[at..at + per_vector] == want[..],
                        "{context}: position {p}, batch·head {bh}: not the quantizer's blocks"
                    );
                }
            }
            0.0
        }
        _ => panic!("{context}: store does not match format {format:?}"),
    }
}

/// Writes a schedule into `cache`, checking after each update that the
/// stores have the format and hold what was written. Returns the worst
/// quantization error in steps.
fn exercise(mut cache: LayerCache, format: CacheFormat, compute: Dtype, context: &str) -> f32 {
    let mut keys: Rows = Vec::new();
    let mut values: Rows = Vec::new();
    let mut worst = 0.0f32;
    for (step, n) in [5, 1, 1, 1, 9, 1].into_iter().enumerate() {
        let (k_rows, k) = random_rows(2 * step as u64 + 1, n, compute);
        let (v_rows, v) = random_rows(2 * step as u64 + 2, n, compute);
        keys.extend(k_rows);
        values.extend(v_rows);
        let attend: Attend = cache.update_and_fetch(&k, &v).expect("update");
        let context = format!("{context}, step {step}");
        worst = worst.max(check_store(
            &attend.keys,
            format.keys,
            compute,
            &keys,
            &format!("{context} keys"),
        ));
        worst = worst.max(check_store(
            &attend.values,
            format.values,
            compute,
            &values,
            &format!("{context} values"),
        ));
        // Quantized or not, a store comes sliced to the positions written.
        assert_eq!(attend.keys.positions() as usize, keys.len(), "{context}");
        assert_eq!(
            attend.values.positions() as usize,
            values.len(),
            "{context}"
        );
    }
    worst
}

fn both_caches(format: CacheFormat) -> [(&'static str, LayerCache); 2] {
    [
        ("KvCache", LayerCache::Plain(KvCache::new(format))),
        (
            "RotatingKvCache",
            LayerCache::Rotating(RotatingKvCache::new(WIDE_WINDOW, format).expect("cache")),
        ),
    ]
}

#[test]
fn float_formats_cast_on_insert() {
    for compute in [Dtype::Float32, Dtype::Bfloat16] {
        for stored in [
            None,
            Some(Dtype::Bfloat16),
            Some(Dtype::Float16),
            Some(Dtype::Float32),
        ] {
            let format = CacheFormat {
                keys: KvFormat::Float(stored),
                values: KvFormat::Float(stored),
                ..CacheFormat::COMPUTE
            };
            for (kind, cache) in both_caches(format) {
                exercise(
                    cache,
                    format,
                    compute,
                    &format!("{kind} {stored:?} from {compute}"),
                );
            }
        }
    }
}

#[test]
fn every_quantized_format_works_in_both_caches() {
    let mut report = Vec::new();
    for bits in [2, 3, 4, 5, 6, 8] {
        for group_size in [32, 64, 128] {
            let q = KvFormat::Quantized { bits, group_size };
            let format = CacheFormat {
                keys: q,
                values: q,
                ..CacheFormat::COMPUTE
            };
            for (kind, cache) in both_caches(format) {
                let worst = exercise(
                    cache,
                    format,
                    Dtype::Float32,
                    &format!("{kind} {bits}-bit group {group_size}"),
                );
                report.push(format!("{kind} {bits}/{group_size}: {worst:.3}"));
            }
        }
    }
    println!("worst quantization error in steps: {}", report.join(", "));
}

#[test]
fn every_block_format_works_in_both_caches_and_both_dtypes() {
    for dtype in QUANTIZABLE {
        for compute in [Dtype::Float32, Dtype::Bfloat16] {
            let format = CacheFormat {
                keys: KvFormat::Block(dtype),
                values: KvFormat::Block(dtype),
                ..CacheFormat::COMPUTE
            };
            for (kind, cache) in both_caches(format) {
                exercise(
                    cache,
                    format,
                    compute,
                    &format!("{kind} {dtype} from {compute}"),
                );
            }
        }
    }
    let mixed = CacheFormat {
        keys: KvFormat::Block(GgufDtype::Q8_0),
        values: KvFormat::Quantized {
            bits: 4,
            group_size: 64,
        },
        ..CacheFormat::COMPUTE
    };
    for (kind, cache) in both_caches(mixed) {
        exercise(
            cache,
            mixed,
            Dtype::Float32,
            &format!("{kind} q8_0 keys, mlx4 values"),
        );
    }
}

#[test]
fn quantized_formats_in_a_bfloat16_model() {
    for bits in [4, 6, 8] {
        let q = KvFormat::Quantized {
            bits,
            group_size: 64,
        };
        let format = CacheFormat {
            keys: q,
            values: q,
            ..CacheFormat::COMPUTE
        };
        for (kind, cache) in both_caches(format) {
            exercise(
                cache,
                format,
                Dtype::Bfloat16,
                &format!("{kind} {bits}-bit bf16"),
            );
        }
    }
}

#[test]
fn keys_and_values_take_separate_formats() {
    let formats = [
        CacheFormat {
            keys: KvFormat::Quantized {
                bits: 8,
                group_size: 64,
            },
            values: KvFormat::Quantized {
                bits: 4,
                group_size: 64,
            },
            ..CacheFormat::COMPUTE
        },
        CacheFormat {
            keys: KvFormat::Float(None),
            values: KvFormat::Quantized {
                bits: 4,
                group_size: 32,
            },
            ..CacheFormat::COMPUTE
        },
        CacheFormat {
            keys: KvFormat::Quantized {
                bits: 6,
                group_size: 128,
            },
            values: KvFormat::Float(Some(Dtype::Bfloat16)),
            ..CacheFormat::COMPUTE
        },
    ];
    for format in formats {
        for (kind, cache) in both_caches(format) {
            exercise(cache, format, Dtype::Float32, &format!("{kind} {format:?}"));
        }
    }
}

#[test]
fn validate_accepts_what_mlx_stores() {
    for bits in [2, 3, 4, 5, 6, 8] {
        for group_size in [32, 64, 128] {
            KvFormat::Quantized { bits, group_size }
                .validate(256)
                .unwrap_or_else(|e| panic!("{bits}/{group_size}: {e}"));
        }
    }
    for dtype in [None, Some(Dtype::Bfloat16), Some(Dtype::Float32)] {
        KvFormat::Float(dtype)
            .validate(100)
            .expect("float formats fit any dimension");
    }
}

#[test]
fn validate_rejects_with_the_accepted_values() {
    let cases = [
        (
            KvFormat::Quantized {
                bits: 7,
                group_size: 64,
            },
            128,
            ["7-bit", "2, 3, 4, 5, 6, 8"],
        ),
        (
            KvFormat::Quantized {
                bits: 1,
                group_size: 64,
            },
            128,
            ["1-bit", "2, 3, 4, 5, 6, 8"],
        ),
        (
            KvFormat::Quantized {
                bits: 4,
                group_size: 48,
            },
            96,
            ["group size 48", "32, 64, 128"],
        ),
        (
            KvFormat::Quantized {
                bits: 4,
                group_size: 64,
            },
            100,
            ["head dimension 100", "group size 64"],
        ),
    ];
    for (format, dim, needles) in cases {
        let message = format
            .validate(dim)
            .expect_err(&format!("{format:?} for dimension {dim}"))
            .to_string();
        for needle in needles {
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        }
    }
}

#[test]
fn bytes_per_vector_by_hand() {
    let q = |bits, group_size| KvFormat::Quantized { bits, group_size };
    // dim·bits/8 packed bytes + 2·(dim/group) scales and biases.
    assert_eq!(
        q(4, 64).bytes_per_vector(256, Dtype::Bfloat16),
        128 + 2 * 4 * 2
    );
    assert_eq!(
        q(6, 32).bytes_per_vector(128, Dtype::Float32),
        96 + 2 * 4 * 4
    );
    assert_eq!(q(3, 128).bytes_per_vector(128, Dtype::Float16), 48 + 2 * 2);
    assert_eq!(
        q(8, 32).bytes_per_vector(64, Dtype::Float32),
        64 + 2 * 2 * 4
    );
    assert_eq!(
        KvFormat::Float(None).bytes_per_vector(256, Dtype::Bfloat16),
        512
    );
    // dim/32 blocks: an f16 scale (and minimum), then the packed values.
    let block = |t| KvFormat::Block(t).bytes_per_vector(256, Dtype::Float32);
    assert_eq!(block(GgufDtype::Q8_0), 8 * (2 + 32));
    assert_eq!(block(GgufDtype::Q4_0), 8 * (2 + 16));
    assert_eq!(block(GgufDtype::Q4_1), 8 * (4 + 16));
    assert_eq!(block(GgufDtype::Q5_0), 8 * (2 + 4 + 16));
    assert_eq!(block(GgufDtype::Q5_1), 8 * (4 + 4 + 16));
    assert_eq!(
        KvFormat::Float(Some(Dtype::Float32)).bytes_per_vector(256, Dtype::Bfloat16),
        1024
    );
}

/// The positions a cache's buffers should hold after `offset` tokens.
fn expected_capacity(cache: &LayerCache, offset: i32, window: i32) -> i32 {
    let round_up = |n: i32| (n + 255) / 256 * 256;
    match cache {
        LayerCache::Plain(_) => round_up(offset),
        LayerCache::Rotating(_) => round_up(offset.min(window)).min(window),
    }
}

#[test]
fn reported_bytes_match_the_arrays_and_the_formula() {
    let q = |bits, group_size| KvFormat::Quantized { bits, group_size };
    let formats = [
        CacheFormat::COMPUTE,
        CacheFormat {
            keys: KvFormat::Float(Some(Dtype::Bfloat16)),
            values: KvFormat::Float(Some(Dtype::Float16)),
            ..CacheFormat::COMPUTE
        },
        CacheFormat {
            keys: q(4, 64),
            values: q(4, 64),
            ..CacheFormat::COMPUTE
        },
        CacheFormat {
            keys: q(6, 32),
            values: q(6, 32),
            ..CacheFormat::COMPUTE
        },
        CacheFormat {
            keys: q(3, 128),
            values: q(2, 32),
            ..CacheFormat::COMPUTE
        },
        CacheFormat {
            keys: q(8, 64),
            values: q(4, 64),
            ..CacheFormat::COMPUTE
        },
        CacheFormat {
            keys: KvFormat::Float(None),
            values: q(5, 64),
            ..CacheFormat::COMPUTE
        },
        CacheFormat {
            keys: KvFormat::Block(GgufDtype::Q8_0),
            values: KvFormat::Block(GgufDtype::Q5_1),
            ..CacheFormat::COMPUTE
        },
    ];
    let schedule = [1, 4, 1, 250, 1, 43, 1];
    let mut checked = 0;
    for compute in [Dtype::Float32, Dtype::Bfloat16] {
        for format in formats {
            let per_vector = format.keys.bytes_per_vector(DIM as usize, compute)
                + format.values.bytes_per_vector(DIM as usize, compute);
            for window in [8, 300] {
                let caches = [
                    LayerCache::Plain(KvCache::new(format)),
                    LayerCache::Rotating(RotatingKvCache::new(window, format).expect("cache")),
                ];
                for mut cache in caches {
                    assert_eq!(cache.nbytes(), 0);
                    for (step, n) in schedule.into_iter().enumerate() {
                        let (_, k) = random_rows(step as u64, n, compute);
                        let (_, v) = random_rows(step as u64 + 50, n, compute);
                        cache.update_and_fetch(&k, &v).expect("update");
                        let held: usize = cache.arrays().iter().map(|a| a.nbytes()).sum();
                        let capacity = expected_capacity(&cache, cache.offset(), window);
                        let context = format!(
                            "{format:?} in {compute}, window {window}, {} tokens",
                            cache.offset()
                        );
                        assert_eq!(cache.nbytes(), held, "{context}");
                        assert_eq!(
                            cache.nbytes(),
                            capacity as usize * per_vector * (BATCH * HEADS) as usize,
                            "{context}: capacity {capacity}"
                        );
                        if let LayerCache::Plain(plain) = &cache {
                            assert_eq!(plain.capacity(), capacity, "{context}");
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    println!("{checked} byte counts checked");
}
