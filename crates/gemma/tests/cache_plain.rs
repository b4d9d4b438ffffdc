//! The growing KV cache of global layers ([`KvCache`]): allocation in whole
//! steps of 256 positions, exact round trips of float keys and values,
//! `trim`, and the positions a quantized format returns.

use gemma::cache::{Attend, CacheFormat, KeyMask, KvCache, KvFormat, KvStore, STEP};
use mlx_core::{Array, Dtype};

const HEADS: i32 = 2;
const DIM: i32 = 32;

/// The value written at `(head, position, j)` for keys (`salt` 0), values
/// (`salt` 1) or overwrites (`salt` 2, 3): a distinct integer, exact in f32.
fn entry(salt: i32, head: i32, position: i32, j: i32) -> f32 {
    (salt * 1_000_000 + position * 64 + head * DIM + j) as f32
}

/// `[1, HEADS, n, DIM]` vectors for positions `start..start + n`.
fn vectors(salt: i32, start: i32, n: i32) -> Array {
    let mut data = Vec::with_capacity((HEADS * n * DIM) as usize);
    for h in 0..HEADS {
        for p in start..start + n {
            for j in 0..DIM {
                data.push(entry(salt, h, p, j));
            }
        }
    }
    Array::from_slice(&data, &[1, HEADS, n, DIM]).expect("array")
}

/// What the cache should return: for each position, the salt it was written with.
fn expected(salts: &[i32]) -> Vec<f32> {
    let mut data = Vec::new();
    for h in 0..HEADS {
        for (p, &salt) in salts.iter().enumerate() {
            for j in 0..DIM {
                data.push(entry(salt, h, p as i32, j));
            }
        }
    }
    data
}

fn float_store(store: &KvStore) -> &Array {
    match store {
        KvStore::Float(a) => a,
        _ => panic!("expected a float store"),
    }
}

/// Writes `n` tokens after the cache's offset (keys salt 0, values salt 1).
fn write(cache: &mut KvCache, n: i32) -> Attend {
    let start = cache.offset();
    cache
        .update_and_fetch(&vectors(0, start, n), &vectors(1, start, n))
        .expect("update")
}

fn round_up(n: i32) -> i32 {
    (n + STEP - 1) / STEP * STEP
}

#[test]
fn first_prefill_allocates_whole_steps() {
    for (tokens, capacity) in [(1, 256), (256, 256), (257, 512), (600, 768)] {
        let mut cache = KvCache::new(CacheFormat::COMPUTE);
        assert_eq!(cache.capacity(), 0);
        let attend = write(&mut cache, tokens);
        assert_eq!(cache.capacity(), capacity, "after a prefill of {tokens}");
        assert_eq!(cache.offset(), tokens);
        let keys = float_store(&attend.keys);
        assert_eq!(keys.shape(), vec![1, HEADS, tokens, DIM]);
        assert_eq!(
            keys.to_vec::<f32>().expect("keys"),
            expected(&vec![0; tokens as usize])
        );
    }
}

#[test]
fn decoding_grows_only_at_step_boundaries() {
    let mut cache = KvCache::new(CacheFormat::COMPUTE);
    let mut growths = Vec::new();
    let mut capacity = cache.capacity();
    for _ in 0..600 {
        let attend = write(&mut cache, 1);
        assert!(matches!(attend.mask, KeyMask::All));
        if cache.capacity() != capacity {
            growths.push((cache.offset(), cache.capacity()));
            capacity = cache.capacity();
        }
        assert_eq!(cache.capacity(), round_up(cache.offset()));
        let offset = cache.offset();
        if offset % 32 == 0 || [1, 255, 256, 257, 511, 512, 513, 600].contains(&offset) {
            mlx_core::eval(&cache.arrays()).expect("eval");
        }
        if [1, 256, 257, 513, 600].contains(&offset) {
            assert_eq!(
                float_store(&attend.keys).to_vec::<f32>().expect("keys"),
                expected(&vec![0; offset as usize]),
                "keys at offset {offset}"
            );
            assert_eq!(
                float_store(&attend.values).to_vec::<f32>().expect("values"),
                expected(&vec![1; offset as usize]),
                "values at offset {offset}"
            );
        }
    }
    // Three allocations for 600 tokens: at tokens 1, 257 and 513.
    assert_eq!(growths, vec![(1, 256), (257, 512), (513, 768)]);
}

#[test]
fn mixed_chunks_return_everything_written() {
    let mut cache = KvCache::new(CacheFormat::COMPUTE);
    for n in [5, 1, 1, 250, 3, 300, 1] {
        let attend = write(&mut cache, n);
        let offset = cache.offset();
        assert_eq!(cache.capacity(), round_up(offset), "after {offset} tokens");
        match (&attend.mask, n) {
            (KeyMask::All, 1) | (KeyMask::Causal, 2..) => {}
            (mask, _) => panic!("a chunk of {n} got mask {mask:?}"),
        }
        let keys = float_store(&attend.keys);
        let values = float_store(&attend.values);
        assert_eq!(keys.shape(), vec![1, HEADS, offset, DIM]);
        assert_eq!(
            keys.to_vec::<f32>().expect("keys"),
            expected(&vec![0; offset as usize])
        );
        assert_eq!(
            values.to_vec::<f32>().expect("values"),
            expected(&vec![1; offset as usize])
        );
    }
}

#[test]
fn trim_rewinds_and_the_next_write_overwrites() {
    let mut cache = KvCache::new(CacheFormat::COMPUTE);
    write(&mut cache, 10);
    assert_eq!(cache.trim(4), 4);
    assert_eq!(cache.offset(), 6);
    assert_eq!(cache.trim(-3), 0);
    assert_eq!(cache.offset(), 6);

    let attend = cache
        .update_and_fetch(&vectors(2, 6, 3), &vectors(3, 6, 3))
        .expect("update");
    assert_eq!(cache.offset(), 9);
    assert!(matches!(attend.mask, KeyMask::Causal));
    let mut key_salts = vec![0; 6];
    key_salts.extend([2; 3]);
    let mut value_salts = vec![1; 6];
    value_salts.extend([3; 3]);
    assert_eq!(
        float_store(&attend.keys).to_vec::<f32>().expect("keys"),
        expected(&key_salts)
    );
    assert_eq!(
        float_store(&attend.values).to_vec::<f32>().expect("values"),
        expected(&value_salts)
    );

    // Trimming more than was written forgets everything, and no more.
    assert_eq!(cache.trim(100), 9);
    assert_eq!(cache.offset(), 0);
    assert_eq!(cache.capacity(), 256, "trim keeps the buffer");
    let attend = cache
        .update_and_fetch(&vectors(2, 0, 1), &vectors(3, 0, 1))
        .expect("update");
    assert_eq!(
        float_store(&attend.keys).to_vec::<f32>().expect("keys"),
        expected(&[2])
    );
    assert_eq!(
        float_store(&attend.values).to_vec::<f32>().expect("values"),
        expected(&[3])
    );
}

/// Dequantized `[1, HEADS, positions, DIM]` values of a store, as f32.
fn host(store: &KvStore) -> Vec<f32> {
    store
        .decoded(Dtype::Float32)
        .expect("decode")
        .astype(Dtype::Float32)
        .expect("astype")
        .to_vec::<f32>()
        .expect("to_vec")
}

/// Checks that the first `offset` positions of a store hold
/// what was written (within 8-bit quantization error of the group range).
fn check_prefix(store: &KvStore, salt: i32, offset: i32) {
    let got = host(store);
    let cap = store.positions();
    for h in 0..HEADS {
        for p in 0..offset {
            for j in 0..DIM {
                let at = ((h * cap + p) * DIM + j) as usize;
                let want = entry(salt, h, p, j);
                // The group is DIM values spanning DIM − 1; 8 bits: step (DIM − 1)/255.
                let step = (DIM - 1) as f32 / 255.0;
                assert!(
                    (got[at] - want).abs() <= step + want.abs() * 1e-6,
                    "head {h} position {p} [{j}]: {} vs {want}",
                    got[at]
                );
            }
        }
    }
}

#[test]
fn quantized_format_returns_the_positions_written() {
    let q8 = KvFormat::Quantized {
        bits: 8,
        group_size: 32,
    };
    for format in [
        CacheFormat {
            keys: q8,
            values: q8,
            ..CacheFormat::COMPUTE
        },
        CacheFormat {
            keys: KvFormat::Float(None),
            values: q8,
            ..CacheFormat::COMPUTE
        },
    ] {
        let mut cache = KvCache::new(format);
        // Prefill of 5 into a buffer of 256: the 5 positions, causally masked.
        let attend = write(&mut cache, 5);
        assert_eq!(cache.capacity(), 256);
        assert_eq!(attend.keys.positions(), 5);
        assert_eq!(attend.values.positions(), 5);
        assert!(matches!(attend.mask, KeyMask::Causal), "{:?}", attend.mask);
        check_prefix(&attend.keys, 0, 5);
        check_prefix(&attend.values, 1, 5);

        // One decoded token at position 5 sees keys 0..=5, all of them.
        let attend = write(&mut cache, 1);
        assert_eq!(attend.values.positions(), 6);
        assert!(matches!(attend.mask, KeyMask::All), "{:?}", attend.mask);
        check_prefix(&attend.values, 1, 6);

        // Filling the buffer exactly.
        let attend = write(&mut cache, 250);
        assert_eq!(cache.offset(), 256);
        assert_eq!(attend.keys.positions(), 256);
        assert!(matches!(attend.mask, KeyMask::Causal), "{:?}", attend.mask);
        check_prefix(&attend.keys, 0, 256);

        // Growing to 512 positions: the new token sees 0..=256.
        let attend = write(&mut cache, 1);
        assert_eq!(cache.capacity(), 512);
        assert_eq!(attend.values.positions(), 257);
        assert!(matches!(attend.mask, KeyMask::All), "{:?}", attend.mask);
        check_prefix(&attend.keys, 0, 257);
        check_prefix(&attend.values, 1, 257);
    }
}
