//! The greedy pick of a decode step as one kernel (on the GPU, or on the
//! CPU in Rust): the argmax of the logits plus a sparse logit bias, and
//! whether every logit is finite.
//!
//! MLX's operations for the same (the float cast, the non-finite check and
//! its reduction, the bias's gather and scatter, and an argmax) took about
//! 13 kernels and 85 µs per step on the H200, and as many operations over
//! the 1 MB row on the CPU.

use std::sync::Arc;

use mlx_core::cpu_kernel::{cpu_kernel, CpuKernelFn};
use mlx_core::device::{default_device, Device};
use mlx_core::kernel::{Launch, OutputSpec, TemplateArg};
use mlx_core::{Array, Dtype};

use super::program::{kernel_with_header, one};

/// Threads of the kernel's single block (32 warps).
const THREADS: i32 = 1024;

/// Device functions of the greedy pick: the better of two (value, id)
/// candidates (the larger value, the lower id among equals) and its
/// reduction over a warp.
const GREEDY_HEADER: &str = r#"
__device__ __forceinline__ void gemma_keep_better(float& best, unsigned int& at, float value, unsigned int id) {
  if (value > best || (value == best && id < at)) {
    best = value;
    at = id;
  }
}

__device__ __forceinline__ void gemma_warp_best(float& best, unsigned int& at) {
  for (int o = 16; o > 0; o >>= 1) {
    const float value = __shfl_xor_sync(0xffffffffu, best, o);
    const unsigned int id = __shfl_xor_sync(0xffffffffu, at, o);
    gemma_keep_better(best, at, value, id);
  }
}
"#;

/// The kernel body. `mask` flags the biased ids (bit `i % 32` of word
/// `i / 32`): the main pass skips them and the first `NB` threads score
/// them as `float(logit) + bias`. Ties go to the lowest id, as in MLX's
/// argmax; NaN never wins (the finiteness flag reports it), and a row of
/// NaN picks id 0, so that the step queued after it embeds a valid id.
const GREEDY: &str = r#"
  constexpr int VEC = 16 / sizeof(T);
  __shared__ float top_value[32];
  __shared__ unsigned int top_id[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  float best = -INFINITY;
  unsigned int at = 0xffffffffu;
  bool finite = true;
  const uint4* chunks = reinterpret_cast<const uint4*>(logits);
  #pragma unroll 4
  for (int c = threadIdx.x; c < V / VEC; c += blockDim.x) {
    const uint4 raw = chunks[c];
    const T* vals = reinterpret_cast<const T*>(&raw);
    const unsigned int skip = __ldg(mask + c * VEC / 32) >> (c * VEC % 32);
    #pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float x = static_cast<float>(vals[k]);
      finite = finite && isfinite(x);
      if (!((skip >> k) & 1u) && x > best) {
        best = x;
        at = c * VEC + k;
      }
    }
  }
  for (int b = threadIdx.x; b < NB; b += blockDim.x) {
    const unsigned int id = bias_ids[b];
    gemma_keep_better(best, at, static_cast<float>(logits[id]) + bias_values[b], id);
  }
  gemma_warp_best(best, at);
  if (lane == 0) {
    top_value[warp] = best;
    top_id[warp] = at;
  }
  const bool all_finite = __syncthreads_and(finite);
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    best = lane < warps ? top_value[lane] : -INFINITY;
    at = lane < warps ? top_id[lane] : 0xffffffffu;
    gemma_warp_best(best, at);
    if (lane == 0) {
      picked[0] = at == 0xffffffffu ? 0u : at;
      picked[1] = all_finite ? 1u : 0u;
    }
  }
"#;

/// The mask words and the (id, bias) pairs of a [`GreedyPick`].
type HostBias = (Vec<u32>, Vec<(u32, f32)>);

/// A logit bias laid out for [`GreedyPick::pick`], built once per
/// generation.
#[derive(Debug)]
pub struct GreedyPick {
    /// Entries of the logits row.
    vocab: i32,
    /// One bit per id, set for the biased ids, `[ceil(vocab / 32)]` uint32.
    mask: Array,
    /// The biased ids, `[n]` uint32 (one unread entry when there are none:
    /// every input of a kernel holds data).
    ids: Array,
    /// Their biases, `[n]` float32 (likewise).
    values: Array,
    /// How many of `ids` are biased.
    count: i32,
    /// `mask` and the (id, bias) pairs on the host, for the CPU's pick.
    host: Arc<HostBias>,
}

impl GreedyPick {
    /// The pick over logits rows of `vocab` entries with the bias `pairs`
    /// of (id, bias): distinct ids, each below `vocab` (as
    /// `sample::LogitBias` keeps them). `None` when an id is outside the
    /// vocabulary or repeated.
    pub fn new(vocab: i32, pairs: &[(u32, f32)]) -> mlx_core::Result<Option<GreedyPick>> {
        let words = (vocab.max(0) as usize).div_ceil(32);
        let mut mask = vec![0u32; words];
        for &(id, _) in pairs {
            let bit = 1 << (id % 32);
            match mask.get_mut(id as usize / 32) {
                Some(word) if i64::from(id) < i64::from(vocab) && *word & bit == 0 => *word |= bit,
                _ => return Ok(None),
            }
        }
        let host = Arc::new((mask.clone(), pairs.to_vec()));
        let (mut ids, mut values): (Vec<u32>, Vec<f32>) = pairs.iter().copied().unzip();
        let count = ids.len() as i32;
        if ids.is_empty() {
            ids.push(0);
            values.push(0.0);
        }
        Ok(Some(GreedyPick {
            vocab,
            mask: Array::from_slice(&mask, &[words as i32])?,
            ids: Array::from_slice(&ids, &[ids.len() as i32])?,
            values: Array::from_slice(&values, &[values.len() as i32])?,
            count,
            host,
        }))
    }

    /// `[id, finite]` as uint32 `[2]` for one row of logits `[1, vocab]`:
    /// the argmax of the row (in float32) plus the bias, the lowest id
    /// among equals, and 1 when every logit is finite (before the bias),
    /// else 0. `None` when the row does not suit the kernel (another
    /// length, a dtype other than float32, float16 and bfloat16, or a row
    /// not made of 16-byte chunks).
    pub fn pick(&self, logits: &Array) -> mlx_core::Result<Option<Array>> {
        if default_device()? == Device::Cpu {
            return self.pick_on_cpu(logits);
        }
        let dtype = logits.dtype();
        let fits = matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16)
            && logits.shape() == [1, self.vocab]
            && (self.vocab as usize * dtype.size_bytes()).is_multiple_of(16);
        if !fits {
            return Ok(None);
        }
        let kernel = kernel_with_header(
            "gemma_greedy_pick",
            (&["logits", "mask", "bias_ids", "bias_values"], &["picked"]),
            GREEDY,
            GREEDY_HEADER,
            &[],
        )?;
        let out = kernel.apply(
            &[logits, &self.mask, &self.ids, &self.values],
            &[OutputSpec {
                shape: vec![2],
                dtype: Dtype::Uint32,
            }],
            Launch {
                grid: [THREADS, 1, 1],
                block: [THREADS, 1, 1],
                shared_bytes: 0,
            },
            &[
                ("T", TemplateArg::Dtype(dtype)),
                ("V", TemplateArg::Int(self.vocab)),
                ("NB", TemplateArg::Int(self.count)),
            ],
        )?;
        Ok(Some(one(out, "greedy pick")?))
    }
}

impl GreedyPick {
    /// [`GreedyPick::pick`] on the CPU, for float32 rows.
    fn pick_on_cpu(&self, logits: &Array) -> mlx_core::Result<Option<Array>> {
        if logits.dtype() != Dtype::Float32 || logits.shape() != [1, self.vocab] {
            return Ok(None);
        }
        let host = Arc::clone(&self.host);
        let kernel: Arc<CpuKernelFn> = Arc::new(move |inputs, out| {
            let (mask, pairs) = (&host.0, &host.1);
            let row: &[f32] = inputs
                .first()
                .and_then(|b| bytemuck::try_cast_slice(b).ok())
                .ok_or("the greedy pick takes one float32 row")?;
            let (mut best, mut at, mut finite) = (f32::NEG_INFINITY, u32::MAX, true);
            // Each 32 logits (one word of the mask): checked for finiteness
            // and skipped unless their largest beats the best so far.
            for (c, (word, values)) in mask.iter().zip(row.chunks(32)).enumerate() {
                finite &= values.iter().all(|v| v.is_finite());
                let top = values.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                if top <= best {
                    continue;
                }
                for (k, &v) in values.iter().enumerate() {
                    if (word >> k) & 1 == 0 && v > best {
                        (best, at) = (v, (32 * c + k) as u32);
                    }
                }
            }
            for &(id, bias) in pairs {
                let v = row.get(id as usize).ok_or("a biased id outside the row")? + bias;
                if v > best || (v == best && id < at) {
                    (best, at) = (v, id);
                }
            }
            // All NaN: id 0 (a valid id for the step queued after this one;
            // the flag stops the generation).
            let picked = [if at == u32::MAX { 0 } else { at }, u32::from(finite)];
            out.copy_from_slice(bytemuck::cast_slice(&picked));
            Ok(())
        });
        cpu_kernel(&[logits], &[2], Dtype::Uint32, kernel).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use mlx_core::{Array, Dtype};

    use super::GreedyPick;

    #[test]
    fn a_repeated_or_outside_id_is_refused() {
        assert!(GreedyPick::new(64, &[(5, 1.0), (5, 2.0)])
            .unwrap()
            .is_none());
        assert!(GreedyPick::new(64, &[(64, 1.0)]).unwrap().is_none());
        assert!(GreedyPick::new(64, &[(63, 1.0), (0, -1.0)])
            .unwrap()
            .is_some());
        assert!(GreedyPick::new(64, &[]).unwrap().is_some());
    }

    #[test]
    fn rows_the_kernel_cannot_read_are_left_to_mlx() {
        let pick = GreedyPick::new(64, &[(3, 1.0)]).unwrap().unwrap();
        let row = |shape: &[i32], dtype| {
            let n = shape.iter().product::<i32>() as usize;
            Array::from_slice(&vec![0f32; n], shape)
                .unwrap()
                .astype(dtype)
                .unwrap()
        };
        // Another length, two rows, an integer dtype.
        for (shape, dtype) in [
            (vec![1, 72], Dtype::Float32),
            (vec![2, 64], Dtype::Float32),
            (vec![1, 64], Dtype::Int32),
        ] {
            let logits = row(&shape, dtype);
            assert!(pick.pick(&logits).unwrap().is_none(), "{shape:?} {dtype:?}");
        }
        // A row that is not made of 16-byte chunks: 12 bfloat16 logits.
        let short = GreedyPick::new(12, &[]).unwrap().unwrap();
        let logits = row(&[1, 12], Dtype::Bfloat16);
        assert!(short.pick(&logits).unwrap().is_none());
    }

    #[test]
    fn the_cpu_pick_is_the_biased_argmax_and_the_finiteness() {
        let vocab = 1000;
        let mut logits: Vec<f32> = (0..vocab)
            .map(|i| ((i * 7919) % 997) as f32 / 100.0)
            .collect();
        let top = logits.iter().cloned().fold(f32::MIN, f32::max);
        let pick = |pairs: &[(u32, f32)], logits: &[f32]| -> Vec<u32> {
            let p = GreedyPick::new(vocab, pairs).unwrap().unwrap();
            let row = Array::from_slice(logits, &[1, vocab]).unwrap();
            p.pick(&row).unwrap().unwrap().to_vec::<u32>().unwrap()
        };
        // The first of two equal maxima, then a bias taking another id over.
        logits[700] = top + 1.0;
        logits[300] = top + 1.0;
        assert_eq!(pick(&[], &logits), vec![300, 1]);
        assert_eq!(pick(&[(300, -5.0)], &logits), vec![700, 1]);
        assert_eq!(pick(&[(999, 100.0)], &logits), vec![999, 1]);
        // A tie between a biased id and an unbiased one: the lower id.
        assert_eq!(pick(&[(900, top + 1.0 - logits[900])], &logits)[0], 300);
        // Non-finite logits are reported; a NaN never wins.
        logits[5] = f32::NAN;
        assert_eq!(pick(&[], &logits), vec![300, 0]);
        logits[5] = f32::INFINITY;
        assert_eq!(pick(&[], &logits), vec![5, 0]);
        // A row of NaN picks id 0, never one outside the vocabulary.
        assert_eq!(
            pick(&[(7, 1.0)], &vec![f32::NAN; vocab as usize]),
            vec![0, 0]
        );
    }
}
