//! Fused GPU kernels for the decoder blocks (CUDA source, compiled once per
//! machine by [`mlx_core::kernel::CudaKernel`]). On the H200 every MLX
//! operation costs 3–12 µs of host time whatever its size (attention about
//! 36 µs), so at decode time a Gemma 3 block is bound by its operation
//! count. [`decode_layer`] runs a whole block for one token as one kernel
//! (the compiled fixed-shape step); the others merge chains of small
//! operations and replace the costliest (the eager pass).

mod decode_layer;
mod greedy;
mod mma_rows;
mod program;
mod stored_kv;
mod weight_rows;

pub use decode_layer::{
    decode_layer, decode_layer_source, grid_barrier, resident_blocks, LayerWeights,
};
pub use greedy::GreedyPick;
pub use mma_rows::tensor_core_source;
pub use weight_rows::{
    dequantize_rows, gguf_dequantize, gguf_row, reads_blocks, rows_gemv, weight_rows_source,
    WeightRows,
};

use mlx_core::fast::{rms_norm, rope, RopeOffset};
use mlx_core::kernel::{Launch, OutputSpec, TemplateArg};
use mlx_core::Array;

use crate::cache::KvStore;
use program::{kernel_with_constants, kernel_with_header, one, two};
use stored_kv::StoredSide;

/// Threads per block of the row-wise kernels (residual norms, GEMV).
const BLOCK: i32 = 256;

/// One block per row of `H` values: `h = x + rms_norm(r)·w_post` and
/// `normed = rms_norm(h)·w_next`, rounding where MLX's separate operations
/// round (each norm's output and the sum, in `T`).
const RESIDUAL_NORMS: &str = r#"
  __shared__ float scratch[32];
  const size_t row = blockIdx.x;
  const T* xr = x + row * H;
  const T* rr = r + row * H;
  T* hr = h + row * H;
  T* nr = normed + row * H;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    const float t = static_cast<float>(rr[i]);
    ss += t * t;
  }
  const float inv_r = rsqrtf(gemma_block_sum(ss, scratch) / H + EPS);
  float sh = 0.0f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    const T n = w_post[i] * static_cast<T>(static_cast<float>(rr[i]) * inv_r);
    const T v = static_cast<T>(static_cast<float>(xr[i]) + static_cast<float>(n));
    hr[i] = v;
    const float t = static_cast<float>(v);
    sh += t * t;
  }
  const float inv_h = rsqrtf(gemma_block_sum(sh, scratch) / H + EPS);
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    nr[i] = w_next[i] * static_cast<T>(static_cast<float>(hr[i]) * inv_h);
  }
"#;

/// One block of `D / 2` threads per (batch, position, head) row of queries
/// `q` `[B, L, HQ·D]` then keys `k` `[B, L, HKV·D]`: the head's RMSNorm
/// (weights `q_w` / `k_w`), then RoPE over all `D` features (halves rotated
/// against each other) at position `offset[0] + l`, written head-major as
/// `q_out` `[B, HQ, L, D]` and `k_out` `[B, HKV, L, D]`. Rounds where MLX's
/// RMSNorm and RoPE round, with RoPE's frequencies computed as MLX's are.
const QK_NORM_ROPE: &str = r#"
  __shared__ float scratch[32];
  constexpr int HALF = D / 2;
  const int L = q_shape[1];
  const int heads = HQ + HKV;
  const int head = blockIdx.x % heads;
  const int bl = blockIdx.x / heads;
  const int l = bl % L;
  const int b = bl / L;
  const bool is_q = head < HQ;
  const T* src = is_q ? q + (static_cast<size_t>(bl) * HQ + head) * D
                      : k + (static_cast<size_t>(bl) * HKV + (head - HQ)) * D;
  const T* w = is_q ? q_w : k_w;
  T* dst = is_q ? q_out + ((static_cast<size_t>(b) * HQ + head) * L + l) * D
                : k_out + ((static_cast<size_t>(b) * HKV + (head - HQ)) * L + l) * D;
  const int i = threadIdx.x;
  const float a = static_cast<float>(src[i]);
  const float c = static_cast<float>(src[i + HALF]);
  const float inv = rsqrtf(gemma_block_sum(a * a + c * c, scratch) / D + EPS);
  const float x1 = static_cast<float>(w[i] * static_cast<T>(a * inv));
  const float x2 = static_cast<float>(w[i + HALF] * static_cast<T>(c * inv));
  const float d = static_cast<float>(i) / static_cast<float>(HALF);
  const float theta = ROPE_SCALE * static_cast<float>(l + offset[0]) * exp2f(-d * LOG2_BASE);
  const float cs = cos(theta);
  const float sn = sin(theta);
  dst[i] = static_cast<T>(x1 * cs - x2 * sn);
  dst[i + HALF] = static_cast<T>(x1 * sn + x2 * cs);
"#;

/// `y = x · Wᵀ` for one input row `x` `[K]` and weights `w` `[N, K]`: one
/// warp per output row, 16-byte loads of both, float accumulation, the sum
/// rounded once to `T` (as MLX's matmul rounds; only the order of the
/// additions differs). `N` and `K` are read from `w`'s shape, so one
/// compilation serves every projection of a dtype.
const GEMV: &str = r#"
  constexpr int WARPS = 8;
  const int N = w_shape[0];
  const int K = w_shape[1];
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (n >= N) return;
  const float acc = gemma_dot(w + static_cast<size_t>(n) * K, x, K, lane);
  if (lane == 0) y[n] = static_cast<T>(acc);
"#;

/// Warps per block of [`DECODE_ATTENTION`].
const ATTENTION_WARPS: i32 = 16;

/// One block of `WARPS` warps per (batch, query head) for a single query
/// `q` `[B, HQ, 1, D]` over the first `valid[0]` positions of the keys and
/// values `[B, HKV, capacity, …]` (grouped-query heads share a key/value
/// head). Each warp runs an online softmax over every `WARPS`-th key, each
/// lane holding `D / 32` features; the warps' partial sums are then merged.
/// Scores, softmax and the weighted sum stay in float; the output is rounded
/// once to `T`. Keys and values are each stored in any cache format
/// ([`stored_kv`]: `KF`, `KB`, `KG` and `VF`, `VB`, `VG` say which), decoded
/// in registers; TurboQuant in its rotated domain, so the caller rotates the
/// query for TurboQuant keys and rotates the output back for TurboQuant
/// values.
const DECODE_ATTENTION: &str = r#"
  constexpr int E = D / 32;
  __shared__ float part_m[WARPS];
  __shared__ float part_l[WARPS];
  __shared__ float part_o[WARPS][D];
  const int row = blockIdx.x;
  const int b = row / HQ;
  const int h = row % HQ;
  const int kvh = h / (HQ / HKV);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int capacity = k_data_shape[2];
  const int n = valid[0] < capacity ? valid[0] : capacity;
  const T* qp = q + static_cast<size_t>(row) * D + lane * E;
  const size_t head = (static_cast<size_t>(b) * HKV + kvh) * capacity;
  float qv[E];
  float o[E];
  #pragma unroll
  for (int e = 0; e < E; ++e) {
    qv[e] = static_cast<float>(qp[e]) * SCALE;
    o[e] = 0.0f;
  }
  float m = -INFINITY;
  float l = 0.0f;
  for (int j = warp; j < n; j += WARPS) {
    typename gemma_kv_elem<KF, T>::type kr[E];
    gemma_kv_row<KF, KB, KG, D, E, T>(k_data, k_scales, k_biases, head + j, lane, kr);
    float s = 0.0f;
    #pragma unroll
    for (int e = 0; e < E; ++e) s += qv[e] * static_cast<float>(kr[e]);
    for (int w = 16; w > 0; w >>= 1) s += __shfl_xor_sync(0xffffffffu, s, w);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);
    const float p = expf(s - m_new);
    l = l * corr + p;
    typename gemma_kv_elem<VF, T>::type vr[E];
    gemma_kv_row<VF, VB, VG, D, E, T>(v_data, v_scales, v_biases, head + j, lane, vr);
    #pragma unroll
    for (int e = 0; e < E; ++e) o[e] = o[e] * corr + p * static_cast<float>(vr[e]);
    m = m_new;
  }
  if (lane == 0) {
    part_m[warp] = m;
    part_l[warp] = l;
  }
  #pragma unroll
  for (int e = 0; e < E; ++e) part_o[warp][lane * E + e] = o[e];
  __syncthreads();
  float top = -INFINITY;
  for (int w = 0; w < WARPS; ++w) top = fmaxf(top, part_m[w]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float sum = 0.0f;
    float acc = 0.0f;
    for (int w = 0; w < WARPS; ++w) {
      const float f = part_m[w] == -INFINITY ? 0.0f : expf(part_m[w] - top);
      sum += part_l[w] * f;
      acc += part_o[w][d] * f;
    }
    out[static_cast<size_t>(row) * D + d] = static_cast<T>(acc / sum);
  }
"#;

/// `x · Wᵀ` through [`linear_row`] with our kernel on: the product with
/// dense weights of the forward pass on the GPU with our kernels.
pub fn gemv(x: &Array, w: &Array) -> mlx_core::Result<Array> {
    linear_row(x, w, true)
}

/// `x · Wᵀ` for a single input row `x` (`[..., K]` with one row) and a
/// dense `w` `[N, K]`, through the GEMV kernel when `fused` and the shapes
/// allow 16-byte loads (`K · size` a multiple of 16); otherwise MLX's matmul.
pub fn linear_row(x: &Array, w: &Array, fused: bool) -> mlx_core::Result<Array> {
    let (n, k) = (w.dim(0)?, w.dim(1)?);
    let rows = x.size() / k.max(1) as usize;
    let bytes = x.dtype().size_bytes() as i32;
    if !fused || rows != 1 || x.dtype() != w.dtype() || (k * bytes) % 16 != 0 {
        return x.linear(w);
    }
    let kernel = kernel_with_constants("gemma_gemv", &["x", "w"], &["y"], GEMV, &[])?;
    let mut shape = x.shape();
    if let Some(last) = shape.last_mut() {
        *last = n;
    }
    let out = kernel.apply(
        &[x, w],
        &[OutputSpec {
            shape,
            dtype: x.dtype(),
        }],
        Launch {
            // One warp per output row, eight per block of BLOCK threads.
            grid: [(n + 7) / 8 * BLOCK, 1, 1],
            block: [BLOCK, 1, 1],
            shared_bytes: 0,
        },
        &[("T", TemplateArg::Dtype(x.dtype()))],
    )?;
    one(out, "GEMV")
}

/// `h = x + rms_norm(r, w_post)` and `rms_norm(h, w_next)`: a residual
/// connection between a branch's post-norm and the next pre-norm. With
/// `fused`, one GPU kernel when all four arrays share a dtype (a float16
/// KV cache under a bfloat16 model gives a float32 branch); otherwise three
/// MLX operations.
pub fn residual_norms(
    x: &Array,
    r: &Array,
    w_post: &Array,
    w_next: &Array,
    eps: f32,
    fused: bool,
) -> mlx_core::Result<(Array, Array)> {
    let one_dtype = [r, w_post, w_next].iter().all(|a| a.dtype() == x.dtype());
    if !fused || !one_dtype {
        let h = x.add(&rms_norm(r, Some(w_post), eps)?)?;
        let normed = rms_norm(&h, Some(w_next), eps)?;
        return Ok((h, normed));
    }
    let shape = x.shape();
    let hidden = shape.last().copied().unwrap_or(1);
    let rows: i32 = shape.iter().rev().skip(1).product();
    let spec = OutputSpec {
        shape: shape.clone(),
        dtype: x.dtype(),
    };
    let kernel = kernel_with_constants(
        "gemma_residual_norms",
        &["x", "r", "w_post", "w_next"],
        &["h", "normed"],
        RESIDUAL_NORMS,
        &[("EPS", eps)],
    )?;
    let out = kernel.apply(
        &[x, r, w_post, w_next],
        &[spec.clone(), spec],
        Launch {
            grid: [rows * BLOCK, 1, 1],
            block: [BLOCK, 1, 1],
            shared_bytes: 0,
        },
        &[
            ("T", TemplateArg::Dtype(x.dtype())),
            ("H", TemplateArg::Int(hidden)),
        ],
    )?;
    two(out, "residual-norms")
}

/// Attention of one query per head, `q` `[B, Hq, 1, D]`, over the first
/// `valid` positions (an int32 array `[1]`) of float `keys` and `values`
/// `[B, Hkv, capacity, D]`, scaled by `scale`: one GPU kernel where MLX's
/// attention costs about 36 µs of host time per call on the H200. `None`
/// when the shapes do not suit it (more than one query, `D` not a multiple
/// of 32 up to 512, `Hq` not a multiple of `Hkv`, mixed dtypes): the caller
/// then uses MLX's attention.
pub fn decode_attention(
    q: &Array,
    keys: &Array,
    values: &Array,
    valid: &Array,
    scale: f32,
) -> mlx_core::Result<Option<Array>> {
    decode_attention_stored(
        q,
        &KvStore::Float(keys.clone()),
        &KvStore::Float(values.clone()),
        valid,
        scale,
    )
}

/// [`decode_attention`] over stored keys and values in any cache format
/// (decoded in registers; TurboQuant in its rotated domain: `q` must be
/// rotated when keys are TurboQuant, and the output is rotated when values
/// are). `None` for shapes the kernel does not take.
pub fn decode_attention_stored(
    q: &Array,
    keys: &KvStore,
    values: &KvStore,
    valid: &Array,
    scale: f32,
) -> mlx_core::Result<Option<Array>> {
    let (keys, values) = (StoredSide::of(keys), StoredSide::of(values));
    let qs = q.shape();
    let (&[b, hq, 1, d], ks, vs) = (qs.as_slice(), keys.data.shape(), values.data.shape()) else {
        return Ok(None);
    };
    let hkv = ks.get(1).copied().unwrap_or(0);
    let fits = ks.len() == 4
        && ks[..3] == vs.get(..3).unwrap_or_default()[..]
        && d % 32 == 0
        && d <= ATTENTION_WARPS * 32
        && hkv > 0
        && hq % hkv == 0
        && keys.suits(q.dtype(), d, d / 32)
        && values.suits(q.dtype(), d, d / 32);
    if !fits {
        return Ok(None);
    }
    let unused = mlx_core::zeros(&[1], q.dtype())?;
    let kernel = kernel_with_header(
        "gemma_decode_attention",
        (
            &[
                "q", "k_data", "k_scales", "k_biases", "v_data", "v_scales", "v_biases", "valid",
            ],
            &["out"],
        ),
        DECODE_ATTENTION,
        &stored_kv::header(),
        &[("SCALE", scale)],
    )?;
    let mut inputs = vec![q];
    inputs.extend(keys.inputs(&unused));
    inputs.extend(values.inputs(&unused));
    inputs.push(valid);
    let mut template = vec![
        ("T", TemplateArg::Dtype(q.dtype())),
        ("D", TemplateArg::Int(d)),
        ("HQ", TemplateArg::Int(hq)),
        ("HKV", TemplateArg::Int(hkv)),
        ("WARPS", TemplateArg::Int(ATTENTION_WARPS)),
    ];
    template.extend(keys.template_args(["KF", "KB", "KG"]));
    template.extend(values.template_args(["VF", "VB", "VG"]));
    let out = kernel.apply(
        &inputs,
        &[OutputSpec {
            shape: qs.clone(),
            dtype: q.dtype(),
        }],
        Launch {
            grid: [b * hq * ATTENTION_WARPS * 32, 1, 1],
            block: [ATTENTION_WARPS * 32, 1, 1],
            shared_bytes: 0,
        },
        &template,
    )?;
    Ok(Some(one(out, "decode attention")?))
}

/// Where the rotary embedding of [`qk_norm_rope`] starts and how it turns.
#[derive(Debug, Clone, Copy)]
pub struct Rotary<'a> {
    /// Position of the first token (a number, or an int32 array `[1]`).
    pub offset: RopeOffset<'a>,
    /// Frequency base.
    pub base: f32,
    /// Position multiplier (1 / linear scaling factor).
    pub scale: f32,
}

/// Queries `q` `[B, L, Hq·D]` and keys `k` `[B, L, Hkv·D]` split into heads
/// `[B, H, L, D]`, each head RMSNorm'd (`q_norm`, `k_norm`) then rotated
/// (RoPE over all `D` features, halves against each other). With `fused`
/// (and `D` a multiple of 64, as in every Gemma 3 size), one GPU kernel;
/// otherwise MLX's operations.
pub fn qk_norm_rope(
    q: &Array,
    k: &Array,
    (q_norm, k_norm): (&Array, &Array),
    (hq, hkv, d): (i32, i32, i32),
    rotary: Rotary<'_>,
    eps: f32,
    fused: bool,
) -> mlx_core::Result<(Array, Array)> {
    let shape = q.shape();
    let (b, l) = (shape[0], shape[1]);
    if !fused || d % 64 != 0 {
        let heads = |a: &Array, count: i32, w: &Array| -> mlx_core::Result<Array> {
            let a = rms_norm(
                &a.reshape(&[b, l, count, d])?.transpose(&[0, 2, 1, 3])?,
                Some(w),
                eps,
            )?;
            rope(&a, d, false, rotary.base, rotary.scale, rotary.offset)
        };
        return Ok((heads(q, hq, q_norm)?, heads(k, hkv, k_norm)?));
    }
    let kernel = kernel_with_constants(
        "gemma_qk_norm_rope",
        &["q", "k", "q_w", "k_w", "offset"],
        &["q_out", "k_out"],
        QK_NORM_ROPE,
        &[
            ("EPS", eps),
            ("LOG2_BASE", rotary.base.log2()),
            ("ROPE_SCALE", rotary.scale),
        ],
    )?;
    let offset = match rotary.offset {
        RopeOffset::Fixed(start) => Array::from_slice(&[start], &[1])?,
        RopeOffset::Dynamic(start) => start.clone(),
    };
    let out = kernel.apply(
        &[q, k, q_norm, k_norm, &offset],
        &[
            OutputSpec {
                shape: vec![b, hq, l, d],
                dtype: q.dtype(),
            },
            OutputSpec {
                shape: vec![b, hkv, l, d],
                dtype: k.dtype(),
            },
        ],
        Launch {
            grid: [b * l * (hq + hkv) * (d / 2), 1, 1],
            block: [d / 2, 1, 1],
            shared_bytes: 0,
        },
        &[
            ("T", TemplateArg::Dtype(q.dtype())),
            ("D", TemplateArg::Int(d)),
            ("HQ", TemplateArg::Int(hq)),
            ("HKV", TemplateArg::Int(hkv)),
        ],
    )?;
    two(out, "q/k norm and RoPE")
}
