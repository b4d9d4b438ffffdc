//! The sliding-window cache ([`RotatingKvCache`]) against a brute-force
//! reference: after any schedule of single-token and multi-token updates,
//! the keys, values and mask it returns let the query at position `pos` see
//! exactly the keys at positions `pos − window + 1 ..= pos`.
//!
//! Two checks per update: every value vector carries its position (+1, in
//! units of [`TAG_UNIT`] for float caches) in component 0, so the rows each query may see map back to a multiset of
//! positions that must equal the window; and attention computed with MLX's
//! `scaled_dot_product_attention` over what the cache returned must equal
//! attention computed on the host over the explicit window.

use gemma::cache::{Attend, CacheFormat, KeyMask, KvFormat, KvStore, RotatingKvCache};
use mlx_core::fast::{scaled_dot_product_attention, AttentionMask};
use mlx_core::{Array, Dtype};

const KV_HEADS: usize = 2;
const Q_HEADS: usize = 4;
const DIM: usize = 32;
/// Position tags of float caches are multiples of this (exact in f32), so the
/// tagged component stays as small as the random ones.
const TAG_UNIT: f32 = 1.0 / 1024.0;

/// A small deterministic generator (64-bit LCG, top bits).
struct Lcg(u64);

impl Lcg {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    /// Uniform in [-1, 1).
    fn float(&mut self) -> f32 {
        self.next_u32() as f32 / (1u64 << 30) as f32 - 1.0
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.next_u32() as usize % items.len()]
    }
}

/// Everything written so far: per position, `[KV_HEADS][DIM]` keys and values.
struct History {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    /// Values are all either a tag or 0 (they survive quantization exactly),
    /// rather than a tag and random numbers.
    structured: bool,
}

impl History {
    fn new(structured: bool) -> History {
        History {
            keys: Vec::new(),
            values: Vec::new(),
            structured,
        }
    }

    /// The tag of `position` in value component 0.
    fn tag(&self, position: usize) -> f32 {
        let unit = if self.structured { 1.0 } else { TAG_UNIT };
        (position + 1) as f32 * unit
    }

    /// The position a tag stands for, if it is one.
    fn position(&self, tag: f32) -> Option<usize> {
        let units = tag / self.tag(0);
        let rounded = units.round();
        ((units - rounded).abs() < 0.05 && rounded >= 1.0).then(|| rounded as usize - 1)
    }

    /// Keys and values for `n` new positions: random keys, values tagged with
    /// their position in component 0.
    fn extend(&mut self, rng: &mut Lcg, n: usize) -> (Array, Array) {
        let start = self.keys.len();
        let structured = self.structured;
        for p in start..start + n {
            let tag = self.tag(p);
            let mut k = Vec::with_capacity(KV_HEADS * DIM);
            let mut v = Vec::with_capacity(KV_HEADS * DIM);
            for _ in 0..KV_HEADS {
                for j in 0..DIM {
                    k.push(rng.float());
                    v.push(match (j, structured) {
                        (0, _) => tag,
                        (_, true) if j % 2 == 0 => tag,
                        (_, true) => 0.0,
                        (_, false) => rng.float(),
                    });
                }
            }
            self.keys.push(k);
            self.values.push(v);
        }
        (
            self.device(&self.keys[start..]),
            self.device(&self.values[start..]),
        )
    }

    /// `[1, KV_HEADS, n, DIM]` from per-position vectors.
    fn device(&self, rows: &[Vec<f32>]) -> Array {
        let mut data = Vec::with_capacity(rows.len() * KV_HEADS * DIM);
        for h in 0..KV_HEADS {
            for row in rows {
                data.extend_from_slice(&row[h * DIM..(h + 1) * DIM]);
            }
        }
        Array::from_slice(&data, &[1, KV_HEADS as i32, rows.len() as i32, DIM as i32])
            .expect("array")
    }
}

/// Host `[1, heads, keys, DIM]` values of a store (dequantized), as f32.
fn host(store: &KvStore) -> Vec<f32> {
    store
        .decoded(Dtype::Float32)
        .expect("decode")
        .astype(Dtype::Float32)
        .expect("astype")
        .to_vec::<f32>()
        .expect("to_vec")
}

/// `visible[i][j]`: whether query i of `queries` may see returned key j.
fn visibility(mask: &KeyMask, queries: usize, keys: usize) -> Vec<Vec<bool>> {
    match mask {
        KeyMask::All => vec![vec![true; keys]; queries],
        KeyMask::Causal => (0..queries)
            .map(|i| (0..keys).map(|j| j + queries <= i + keys).collect())
            .collect(),
        KeyMask::Array(m) => {
            assert_eq!(m.dtype(), Dtype::Bool, "mask dtype");
            let shape = m.shape();
            assert_eq!(shape.len(), 2, "mask shape {shape:?}");
            assert_eq!(shape[1] as usize, keys, "mask columns");
            let rows = shape[0] as usize;
            assert!(
                rows == 1 || rows == queries,
                "mask rows {rows} for {queries} queries"
            );
            let values = m.to_vec::<bool>().expect("mask");
            (0..queries)
                .map(|i| {
                    let r = if rows == 1 { 0 } else { i };
                    values[r * keys..(r + 1) * keys].to_vec()
                })
                .collect()
        }
        KeyMask::Leading { valid, .. } => {
            let n = valid.to_vec::<i32>().expect("valid")[0] as usize;
            vec![(0..keys).map(|j| j < n).collect(); queries]
        }
    }
}

/// The positions the query at `pos` must see.
fn window_of(pos: usize, window: usize) -> Vec<usize> {
    (pos.saturating_sub(window - 1)..=pos).collect()
}

/// Checks that the rows each of the `n` new queries (positions `start..`) may
/// see carry exactly the window's positions, each once, on every head.
fn check_positions(
    history: &History,
    attend: &Attend,
    start: usize,
    n: usize,
    window: usize,
    context: &str,
) {
    let keys = attend.keys.positions() as usize;
    assert_eq!(
        attend.values.positions() as usize,
        keys,
        "{context}: keys vs values"
    );
    let values = host(&attend.values);
    let visible = visibility(&attend.mask, n, keys);
    for (i, row) in visible.iter().enumerate() {
        for h in 0..KV_HEADS {
            let mut seen: Vec<usize> = row
                .iter()
                .enumerate()
                .filter(|(_, &v)| v)
                .map(|(j, _)| {
                    let tag = values[(h * keys + j) * DIM];
                    history.position(tag).unwrap_or_else(|| {
                        panic!("{context}: query {i} sees row {j} holding {tag}, not a written position")
                    })
                })
                .collect();
            seen.sort_unstable();
            assert_eq!(
                seen,
                window_of(start + i, window),
                "{context}: query {i} (position {}) head {h}",
                start + i
            );
        }
    }
}

/// Host attention of `[1, Q_HEADS, n, DIM]` queries over the explicit windows.
fn reference_attention(
    history: &History,
    queries: &[f32],
    start: usize,
    n: usize,
    window: usize,
    scale: f32,
) -> Vec<f32> {
    let group = Q_HEADS / KV_HEADS;
    let mut out = vec![0.0f32; Q_HEADS * n * DIM];
    for hq in 0..Q_HEADS {
        let hkv = hq / group;
        for i in 0..n {
            let q = &queries[(hq * n + i) * DIM..(hq * n + i + 1) * DIM];
            let positions = window_of(start + i, window);
            let scores: Vec<f64> = positions
                .iter()
                .map(|&p| {
                    let k = &history.keys[p][hkv * DIM..(hkv + 1) * DIM];
                    q.iter().zip(k).map(|(a, b)| f64::from(a * b)).sum::<f64>() * f64::from(scale)
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (w, &p) in weights.iter().zip(&positions) {
                let v = &history.values[p][hkv * DIM..(hkv + 1) * DIM];
                for j in 0..DIM {
                    out[(hq * n + i) * DIM + j] += (w / total * f64::from(v[j])) as f32;
                }
            }
        }
    }
    out
}

/// Attention with MLX over what the cache returned (float stores only).
fn cache_attention(attend: &Attend, queries: &Array, scale: f32) -> Vec<f32> {
    let (KvStore::Float(k), KvStore::Float(v)) = (&attend.keys, &attend.values) else {
        panic!("expected float stores")
    };
    let mask = match &attend.mask {
        KeyMask::All => AttentionMask::None,
        KeyMask::Causal => AttentionMask::Causal,
        KeyMask::Array(m) => AttentionMask::Array(m),
        KeyMask::Leading { additive, .. } => AttentionMask::Array(additive),
    };
    scaled_dot_product_attention(queries, k, v, scale, mask)
        .expect("sdpa")
        .to_vec::<f32>()
        .expect("to_vec")
}

/// Runs one schedule of chunk sizes through a fresh cache, checking every update.
fn run_schedule(window: usize, format: CacheFormat, schedule: &[usize], seed: u64) {
    let float = matches!(
        (format.keys, format.values),
        (KvFormat::Float(_), KvFormat::Float(_))
    );
    let mut rng = Lcg(seed);
    let mut cache = RotatingKvCache::new(window as i32, format).expect("cache");
    let mut history = History::new(!float);
    let scale = 1.0 / (DIM as f32).sqrt();
    for (step, &n) in schedule.iter().enumerate() {
        let start = history.keys.len();
        let (k, v) = history.extend(&mut rng, n);
        let attend = cache.update_and_fetch(&k, &v).expect("update");
        assert_eq!(cache.offset() as usize, start + n);
        let context = format!(
            "window {window}, format {format:?}, schedule {schedule:?}, step {step} ({n} tokens at {start})"
        );
        check_positions(&history, &attend, start, n, window, &context);
        if float {
            let queries: Vec<f32> = (0..Q_HEADS * n * DIM).map(|_| rng.float()).collect();
            let q = Array::from_slice(&queries, &[1, Q_HEADS as i32, n as i32, DIM as i32])
                .expect("queries");
            let got = cache_attention(&attend, &q, scale);
            let want = reference_attention(&history, &queries, start, n, window, scale);
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(diff < 1e-5, "{context}: attention differs by {diff}");
        }
        mlx_core::eval(&cache.arrays()).expect("eval");
    }
}

/// A random schedule for `window`: chunks below, at and above the window,
/// and runs of single tokens, about `4·window` tokens in all.
fn random_schedule(rng: &mut Lcg, window: usize) -> Vec<usize> {
    let sizes = [
        1,
        1,
        1,
        2,
        3,
        window - 1,
        window,
        window + 1,
        2 * window + 3,
    ];
    let mut schedule = Vec::new();
    let mut total = 0;
    while total < 4 * window {
        let n = rng.pick(&sizes).max(1);
        schedule.push(n);
        total += n;
    }
    schedule
}

#[test]
fn random_schedules_see_exactly_the_window() {
    let mut rng = Lcg(7);
    for window in [4, 7, 16] {
        for trial in 0..12 {
            let schedule = random_schedule(&mut rng, window);
            run_schedule(window, CacheFormat::COMPUTE, &schedule, 100 + trial);
        }
    }
}

#[test]
fn hand_picked_schedules_see_exactly_the_window() {
    let schedules: [(usize, &[usize]); 8] = [
        (4, &[1, 1, 1, 1, 1, 1, 1, 1, 1]),
        (4, &[3, 1, 1, 1, 5]),
        (4, &[4, 4, 1, 4]),
        (7, &[20, 1, 1, 6, 8]),
        (7, &[1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 13]),
        (7, &[6, 2, 1, 7]),
        (16, &[1, 15, 1, 17, 1, 40]),
        (16, &[33, 1, 1, 2]),
    ];
    for (i, (window, schedule)) in schedules.into_iter().enumerate() {
        run_schedule(window, CacheFormat::COMPUTE, schedule, i as u64);
    }
}

#[test]
fn a_window_larger_than_one_allocation_step() {
    // Window 300 > 256: the buffer grows from 256 to 300 positions while
    // decoding, then wraps.
    let mut schedule = vec![250];
    schedule.extend([1; 60]);
    schedule.extend([10, 1, 1, 301, 1]);
    run_schedule(300, CacheFormat::COMPUTE, &schedule, 3);
}

#[test]
fn quantized_formats_see_exactly_the_window() {
    let mut rng = Lcg(11);
    for bits in [2, 3, 4, 5, 6, 8] {
        for group_size in [32] {
            let q = KvFormat::Quantized { bits, group_size };
            for format in [
                CacheFormat {
                    keys: q,
                    values: q,
                    ..CacheFormat::COMPUTE
                },
                CacheFormat {
                    keys: KvFormat::Float(None),
                    values: q,
                    ..CacheFormat::COMPUTE
                },
            ] {
                for window in [4, 7] {
                    let schedule = random_schedule(&mut rng, window);
                    run_schedule(window, format, &schedule, u64::from(bits as u32));
                }
            }
        }
    }
}

#[test]
fn trim_works_until_the_window_wraps() {
    let format = CacheFormat::COMPUTE;
    let mut rng = Lcg(5);
    let mut history = History::new(false);
    let mut cache = RotatingKvCache::new(7, format).expect("cache");
    let (k, v) = history.extend(&mut rng, 5);
    cache.update_and_fetch(&k, &v).expect("update");
    assert_eq!(cache.trim(2), 2);
    assert_eq!(cache.offset(), 3);
    // The next token takes position 3: it must see 0, 1, 2 and itself, with
    // the new vectors, not the trimmed ones.
    history.keys.truncate(3);
    history.values.truncate(3);
    let (k, v) = history.extend(&mut rng, 1);
    let attend = cache.update_and_fetch(&k, &v).expect("update");
    check_positions(&history, &attend, 3, 1, 7, "after trim");
    let got = host(&attend.values);
    let keys = attend.values.positions() as usize;
    let row3: Vec<f32> = (0..DIM).map(|j| got[3 * DIM + j]).collect();
    assert!(keys >= 4);
    assert_eq!(
        row3,
        history.values[3][..DIM].to_vec(),
        "position 3 holds the new vector"
    );

    // Past the window the oldest tokens are gone: nothing can be trimmed.
    let (k, v) = history.extend(&mut rng, 6);
    cache.update_and_fetch(&k, &v).expect("update");
    assert_eq!(cache.offset(), 10);
    assert_eq!(cache.trim(1), 0);
    assert_eq!(cache.offset(), 10);
}

#[test]
fn a_window_below_one_is_rejected() {
    let e = RotatingKvCache::new(0, CacheFormat::COMPUTE).expect_err("window 0");
    assert!(e.to_string().contains("sliding window 0"), "{e}");
}
