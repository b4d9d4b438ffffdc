//! A whole decoder block for one token as a single GPU kernel.
//!
//! Every MLX operation costs the CUDA backend 3–15 µs of host time on the
//! H200, so a decode step made of a dozen operations per layer is bound by
//! their count, not by the GPU. This kernel runs one block per
//! multiprocessor, all resident at once, through the block's five phases
//! (norm and Q/K/V projection; attention split over the blocks, with the
//! q/k norms, RoPE, the cache write and the merge of the splits; the output
//! projection; the residual norms and the gated MLP's gate/up projection;
//! the down projection), with a barrier across the grid between phases, and
//! ends with the residual sum. It rounds where MLX's separate operations
//! round (to `T` after each projection, norm and elementwise operation).
//! Each attention block serves all the query heads of a key/value head that
//! its registers allow from one read of the head's keys and values. The
//! projections' rows are dealt to the blocks in turn, then to their warps,
//! and each warp reads two rows at once (a gate row and its up row in the
//! gated MLP).

use std::sync::OnceLock;

use mlx_core::device::cuda_multiprocessor_count;
use mlx_core::kernel::{Launch, OutputSpec, TemplateArg};
use mlx_core::{Array, Dtype};

use super::program::{kernel_with_header, one, HEADER};
use super::stored_kv::{self, StoredSide};
use crate::cache::LayerKv;
use crate::linear::Linear;
use crate::model::{Layer, LayerGeometry};

/// Warps per block.
const WARPS: i32 = 16;

/// Whether each warp of the single-row projections (Q/K/V, output, down)
/// reads two of its rows at once (27B on the H200: 58.4, 59.2 → 60.5,
/// 60.1 tok/s with the rows dealt to blocks in turn, against 59.4, 59.6
/// without; the kernel 234.7 → 232.0 µs).
const PAIR_ROWS: bool = true;

/// The largest static shared memory of a kernel, in bytes.
const SHARED_LIMIT: i32 = 48 * 1024;

/// The kernel's inputs, in order.
const INPUT_NAMES: [&str; 21] = [
    "x",
    "w_in",
    "w_qkv",
    "q_norm",
    "k_norm",
    "w_o",
    "w_post_attn",
    "w_pre_ffn",
    "w_gate_up",
    "w_down",
    "w_post_ffn",
    "position",
    "write_at",
    "valid",
    "k_data",
    "k_scales",
    "k_biases",
    "v_data",
    "v_scales",
    "v_biases",
    "barrier",
];

/// Query heads the kernel's split counts have room for.
const MAX_HEADS: i32 = 128;

/// Device functions of the layer kernel, after [`HEADER`] and
/// [`stored_kv::header`].
const LAYER_HEADER: &str = r#"
// A barrier across the grid, reusable without a reset: each barrier adds
// 2^31 to `*word` in all (the first block 2^31 − (blocks − 1), every other
// block 1), so its top bit flips once every block has arrived. Every block of
// the grid must be resident.
__device__ __forceinline__ void gemma_grid_sync(unsigned int* word, int blocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int add = blockIdx.x == 0 ? 0x80000000u - (blocks - 1) : 1u;
    __threadfence();
    const unsigned int old = atomicAdd(word, add);
    while (((old ^ *reinterpret_cast<volatile unsigned int*>(word)) & 0x80000000u) == 0) {
      __nanosleep(20);
    }
    __threadfence();
  }
  __syncthreads();
}

template <int N> struct gemma_bits;
template <> struct gemma_bits<2> { using type = unsigned short; };
template <> struct gemma_bits<4> { using type = unsigned int; };
template <> struct gemma_bits<8> { using type = uint2; };
template <> struct gemma_bits<16> { using type = uint4; };

// A load that bypasses L1, for data other blocks wrote in this kernel.
template <typename U>
__device__ __forceinline__ U gemma_load(const U* p) {
  using Bits = typename gemma_bits<sizeof(U)>::type;
  const Bits b = __ldcg(reinterpret_cast<const Bits*>(p));
  U u;
  memcpy(&u, &b, sizeof(U));
  return u;
}

// `N` consecutive values at `p` (N·sizeof(U) a multiple of 4 bytes, `p`
// aligned to the load size) in loads of up to 16 bytes that bypass L1.
template <typename U, int N>
__device__ __forceinline__ void gemma_load_n(const U* p, U* out) {
  constexpr int BYTES = N * static_cast<int>(sizeof(U));
  constexpr int CHUNK = BYTES < 16 ? BYTES : 16;
  using Bits = typename gemma_bits<CHUNK>::type;
  #pragma unroll
  for (int c = 0; c < BYTES / CHUNK; ++c) {
    const Bits b = __ldcg(reinterpret_cast<const Bits*>(p) + c);
    memcpy(reinterpret_cast<char*>(out) + c * CHUNK, &b, CHUNK);
  }
}

// A lane's share of a stored row as [`gemma_kv_row`] gives it, floats in
// 16-byte loads that bypass L1.
template <int F, int BITS, int GS, int D, int E, typename T, typename S, typename B>
__device__ __forceinline__ void gemma_layer_row(
    const void* data, const S* scales, const B* biases, size_t row, int lane,
    typename gemma_kv_elem<F, T>::type* out) {
  if constexpr (F == 0) {
    gemma_load_n<T, E>(reinterpret_cast<const T*>(data) + row * D + lane * E, out);
  } else {
    gemma_kv_row<F, BITS, GS, D, E, T>(data, scales, biases, row, lane, out);
  }
}

// The element type of a kernel input's pointer.
template <typename P> struct gemma_pointee;
template <typename U> struct gemma_pointee<const U*> { using type = U; };

// A lane's share of a stored row between its load and its use. Decoded
// floats in general; floats of T (format 0) as loaded; affine codes of 2, 4
// or 8 bits filling a 16-, 32- or 64-bit word as loaded, with their group's
// scale and bias, decoded where attention reads them (`LIGHT`: as few
// registers as T's floats, so as many rows' loads fit in flight).
template <int F, int BITS, int GS, int D, int E, typename T, typename S, typename B,
          bool WORDS = F == 1 && (BITS == 2 || BITS == 4 || BITS == 8) &&
                       (E * BITS == 16 || E * BITS == 32 || E * BITS == 64)>
struct gemma_kv_held {
  static constexpr bool LIGHT = F == 0;
  typename gemma_kv_elem<F, T>::type v[E];
  __device__ __forceinline__ void load(const void* data, const S* scales, const B* biases, size_t row, int lane) {
    gemma_layer_row<F, BITS, GS, D, E, T>(data, scales, biases, row, lane, v);
  }
  __device__ __forceinline__ float operator[](int e) const { return static_cast<float>(v[e]); }
};

template <int F, int BITS, int GS, int D, int E, typename T, typename S, typename B>
struct gemma_kv_held<F, BITS, GS, D, E, T, S, B, true> {
  static constexpr bool LIGHT = true;
  static constexpr int N = E * BITS / 32 > 0 ? E * BITS / 32 : 1;
  unsigned int w[N];
  S scale;
  B bias;
  __device__ __forceinline__ void load(const void* data, const S* scales, const B* biases, size_t row, int lane) {
    const uint8_t* codes = reinterpret_cast<const uint8_t*>(data) + row * (D * BITS / 8) + lane * (E * BITS / 8);
    if constexpr (E * BITS == 16) {
      w[0] = *reinterpret_cast<const unsigned short*>(codes);
    } else {
      #pragma unroll
      for (int c = 0; c < N; ++c) w[c] = reinterpret_cast<const unsigned int*>(codes)[c];
    }
    const size_t g = row * (D / GS) + lane * E / GS;
    scale = scales[g];
    bias = biases[g];
  }
  __device__ __forceinline__ float operator[](int e) const {
    const unsigned int code = (w[e * BITS / 32] >> (e * BITS % 32)) & ((1u << BITS) - 1u);
    return static_cast<float>(scale) * static_cast<float>(code) + static_cast<float>(bias);
  }
};

// mlx's gelu_approx(g) · u, rounding to `U` after every operation as MLX's
// fused elementwise kernel does.
template <typename U>
__device__ __forceinline__ U gemma_gated_gelu(U g, U u) {
  const float x = static_cast<float>(g);
  const U cube = static_cast<U>(powf(x, 3.0f));
  const U scaled = static_cast<U>(static_cast<float>(cube) * static_cast<float>(static_cast<U>(0.044715f)));
  const U sum = static_cast<U>(x + static_cast<float>(scaled));
  const U inner = static_cast<U>(static_cast<float>(sum) * static_cast<float>(static_cast<U>(0.7978845608028654f)));
  const U t = static_cast<U>(tanhf(static_cast<float>(inner)));
  const U one_plus = static_cast<U>(static_cast<float>(t) + 1.0f);
  const U half = static_cast<U>(x * 0.5f);
  const U gelu = static_cast<U>(static_cast<float>(half) * static_cast<float>(one_plus));
  return static_cast<U>(static_cast<float>(gelu) * static_cast<float>(u));
}

// Rows of `w` (`N` rows of `K` values) dotted with the block's `xs` into
// `out`, rounded to `U`. Rows are dealt to the blocks in turn (row n to
// block n mod G), then to the block's warps in turn, so that every
// multiprocessor reads the same number of rows give or take one. With
// PAIR_, each warp reads two of its rows at once.
template <int PAIR_, int WARPS_, typename U>
__device__ __forceinline__ void gemma_rows(const U* w, int N, int K, const U* xs, U* out) {
  const int lane = threadIdx.x & 31;
  const int first = blockIdx.x + gridDim.x * (threadIdx.x >> 5);
  const int step = gridDim.x * WARPS_;
  if (PAIR_) {
    for (int n = first; n < N; n += 2 * step) {
      const int n2 = n + step;
      if (n2 < N) {
        const U* rows[2] = {w + static_cast<size_t>(n) * K, w + static_cast<size_t>(n2) * K};
        float acc[2];
        gemma_dots<2>(rows, xs, K, lane, acc);
        if (lane == 0) {
          out[n] = static_cast<U>(acc[0]);
          out[n2] = static_cast<U>(acc[1]);
        }
      } else {
        const float acc = gemma_dot(w + static_cast<size_t>(n) * K, xs, K, lane);
        if (lane == 0) out[n] = static_cast<U>(acc);
      }
    }
  } else {
    for (int n = first; n < N; n += step) {
      const float acc = gemma_dot(w + static_cast<size_t>(n) * K, xs, K, lane);
      if (lane == 0) out[n] = static_cast<U>(acc);
    }
  }
}
"#;

/// The kernel body; see the module documentation. `scratch` holds, in
/// order: q/k/v `[(HQ + 2·HKV)·D]`, the attention output `[HQ·D]`, the
/// output projection `[H]`, the residual after attention `[H]`, the gated
/// activations `[I]` and the down projection `[H]`. `partials` holds each
/// query head's attention splits' running max, sum and unnormalised
/// output; `barrier` the grid barriers' word and, from its 33rd int, one
/// count of finished splits per group of query heads.
const DECODE_LAYER: &str = r#"
  constexpr int THREADS = WARPS * 32;
  constexpr int HALF = D / 2;
  constexpr int PAIRS = HALF / 32;
  constexpr int E = D / 32;
  __shared__ __align__(16) unsigned char smem[SMEM];
  __shared__ float red[32];
  constexpr int GROUPS = HQ / QB;
  __shared__ float part_m[WARPS * QB];
  __shared__ float part_l[WARPS * QB];
  __shared__ float head_q[QB * D];
  __shared__ float rope_cs[D];
  __shared__ T norm_w[2 * D];
  __shared__ float head_k[D];
  __shared__ float head_v[D];
  __shared__ unsigned char kv_codes[2 * D];
  __shared__ float kv_par[D / 8];
  __shared__ bool last_split;
  T* xs = reinterpret_cast<T*>(smem);
  const int G = gridDim.x;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int H = w_in_shape[0];
  const int I = w_down_shape[1];
  const int NQKV = (HQ + 2 * HKV) * D;
  const int capacity = k_data_shape[2];
  const int n_valid = valid[0] < capacity ? valid[0] : capacity;
  // Splits of the keys per group of QB query heads: one per 64 keys, at
  // most one block each.
  const int max_splits = G / GROUPS > 0 ? G / GROUPS : 1;
  const int wanted = (n_valid + 63) / 64 > 0 ? (n_valid + 63) / 64 : 1;
  const int S = wanted < max_splits ? wanted : max_splits;
  unsigned int* bar = reinterpret_cast<unsigned int*>(const_cast<int*>(barrier));
  T* kc = reinterpret_cast<T*>(const_cast<void*>(static_cast<const void*>(k_data)));
  T* vc = reinterpret_cast<T*>(const_cast<void*>(static_cast<const void*>(v_data)));
  T* qkv = scratch;
  T* attn = qkv + NQKV;
  T* o = attn + HQ * D;
  T* hmid = o + H;
  T* act = hmid + H;
  T* dn = act + I;

  // 1. Input norm (every block, into shared memory), Q/K/V projection;
  // then, while the barrier waits, the RoPE table of the token's position
  // (cosines, then sines) and the head norms' weights, for phase 2.
  {
    float ss = 0.0f;
    for (int i = tid; i < H; i += THREADS) {
      const float t = static_cast<float>(x[i]);
      ss += t * t;
    }
    const float inv = rsqrtf(gemma_block_sum(ss, red) / H + EPS);
    for (int i = tid; i < H; i += THREADS) {
      xs[i] = w_in[i] * static_cast<T>(static_cast<float>(x[i]) * inv);
    }
    __syncthreads();
    gemma_rows<PAIR, WARPS>(w_qkv, NQKV, H, xs, qkv);
    const float pos = static_cast<float>(position[0]);
    for (int i = tid; i < HALF; i += THREADS) {
      const float d = static_cast<float>(i) / static_cast<float>(HALF);
      const float theta = ROPE_SCALE * pos * exp2f(-d * LOG2_BASE);
      rope_cs[i] = cos(theta);
      rope_cs[i + HALF] = sin(theta);
    }
    for (int i = tid; i < D; i += THREADS) {
      norm_w[i] = q_norm[i];
      norm_w[D + i] = k_norm[i];
    }
  }
  gemma_grid_sync(bar, G);

  // 2. Attention: each block one split of the valid keys for QB query
  // heads of one key/value head (whose keys and values it reads once for
  // all QB). Warps 0 to QB − 1 first take the heads' queries, warp QB the
  // new key (RMSNorm, RoPE from the tables of phase 1) and warp QB + 1 the
  // new value, into shared memory; the first split's block of the key/value
  // head's first query heads also writes the key and value into the cache,
  // and every block reads them at the new slot from shared memory. The
  // warps share the split by an online softmax, merged in the block; the
  // last block of a group to finish merges the group's splits.
  {
    const int at = write_at[0];
    const int n = n_valid;
    float* part_o = reinterpret_cast<float*>(smem);
    unsigned int* done = bar + 32;
    for (int item = blockIdx.x; item < GROUPS * S; item += G) {
      const int group = item / S;
      const int s = item % S;
      const int h0 = group * QB;
      const int kvh = h0 / (HQ / HKV);
      const bool writer = s == 0 && h0 % (HQ / HKV) == 0;
      if (warp <= QB) {
        const bool is_q = warp < QB;
        const T* src = qkv + (is_q ? (h0 + warp) * D : HQ * D + kvh * D);
        const T* w = norm_w + (is_q ? 0 : D);
        float* dst = is_q ? head_q + warp * D : head_k;
        float a[PAIRS];
        float c[PAIRS];
        float ss = 0.0f;
        #pragma unroll
        for (int e = 0; e < PAIRS; ++e) {
          a[e] = static_cast<float>(gemma_load(src + lane + 32 * e));
          c[e] = static_cast<float>(gemma_load(src + lane + 32 * e + HALF));
          ss += a[e] * a[e] + c[e] * c[e];
        }
        for (int o2 = 16; o2 > 0; o2 >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o2);
        const float inv = rsqrtf(ss / D + EPS);
        #pragma unroll
        for (int e = 0; e < PAIRS; ++e) {
          const int i = lane + 32 * e;
          const float x1 = static_cast<float>(w[i] * static_cast<T>(a[e] * inv));
          const float x2 = static_cast<float>(w[i + HALF] * static_cast<T>(c[e] * inv));
          const float cs = rope_cs[i];
          const float sn = rope_cs[i + HALF];
          const T lo = static_cast<T>(x1 * cs - x2 * sn);
          const T hi = static_cast<T>(x1 * sn + x2 * cs);
          dst[i] = static_cast<float>(lo);
          dst[i + HALF] = static_cast<float>(hi);
          if (KF == 0 && !is_q && writer) {
            T* row = kc + (static_cast<size_t>(kvh) * capacity + at) * D;
            row[i] = lo;
            row[i + HALF] = hi;
          }
        }
      } else if (warp == QB + 1) {
        // Each lane E values, loaded at once before any store.
        T v[E];
        gemma_load_n<T, E>(qkv + (HQ + HKV) * D + kvh * D + lane * E, v);
        T* row = vc + (static_cast<size_t>(kvh) * capacity + at) * D + lane * E;
        #pragma unroll
        for (int e = 0; e < E; ++e) {
          head_v[lane * E + e] = static_cast<float>(v[e]);
          if (VF == 0 && writer) row[e] = v[e];
        }
      }
      __syncthreads();
      // Compressed sides: TurboQuant keys take the queries into their
      // rotated domain (rounded to T, as the eager rotation returns them);
      // the new key and value are encoded as the eager path encodes them,
      // the writer storing them, and attention reads back their decoding.
      const size_t head_row = static_cast<size_t>(kvh) * capacity;
      if constexpr (KF == 2) {
        gemma_turbo_rotate(head_q, QB * D, GEMMA_TURBO_SIGNS_BEFORE, GEMMA_TURBO_SIGNS_AFTER);
        for (int i = tid; i < QB * D; i += THREADS) head_q[i] = static_cast<float>(static_cast<T>(head_q[i]));
        __syncthreads();
      }
      if constexpr (KF != 0) {
        gemma_kv_encode<KF, KB, KG, D, T>(head_k, kv_codes, kv_par, writer, k_data, k_scales, k_biases, head_row + at);
      }
      if constexpr (VF != 0) {
        gemma_kv_encode<VF, VB, VG, D, T>(head_v, kv_codes + D, kv_par + D / 16, writer, v_data, v_scales, v_biases, head_row + at);
      }
      const int chunk = (n + S - 1) / S;
      const int begin = s * chunk;
      const int end = begin + chunk < n ? begin + chunk : n;
      float qv[QB][E];
      float acc[QB][E];
      float m[QB];
      float l[QB];
      #pragma unroll
      for (int g = 0; g < QB; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
        #pragma unroll
        for (int e = 0; e < E; ++e) {
          qv[g][e] = head_q[g * D + lane * E + e] * SCALE;
          acc[g][e] = 0.0f;
        }
      }
      // Each warp reads U keys' and values' rows at once (keys j, j + WARPS,
      // …), so that their loads are in flight together: fewer where a side
      // is decoded into float registers at its load (TurboQuant, and
      // affine codes that fill no whole word), as many as for floats where
      // both sides are held as loaded (H200, 1B at 32,640 tokens: q8_0
      // 449, 459 → 508, 492 tok/s; 27B at 32,768: q4_0 51.8 → 55.3).
      using KeyRow = gemma_kv_held<KF, KB, KG, D, E, T, typename gemma_pointee<decltype(k_scales)>::type,
                                   typename gemma_pointee<decltype(k_biases)>::type>;
      using ValueRow = gemma_kv_held<VF, VB, VG, D, E, T, typename gemma_pointee<decltype(v_scales)>::type,
                                     typename gemma_pointee<decltype(v_biases)>::type>;
      constexpr int U_ROWS = E <= 4 ? 8 : (E <= 8 ? 4 : 2);
      constexpr int U = KeyRow::LIGHT && ValueRow::LIGHT ? U_ROWS : (E <= 8 ? 2 : 1);
      for (int j0 = begin + warp; j0 < end; j0 += U * WARPS) {
        KeyRow kr[U];
        ValueRow vr[U];
        #pragma unroll
        for (int u = 0; u < U; ++u) {
          const int j = j0 + u * WARPS < end ? j0 + u * WARPS : j0;
          const size_t row = head_row + j;
          kr[u].load(k_data, k_scales, k_biases, row, lane);
          vr[u].load(v_data, v_scales, v_biases, row, lane);
        }
        float sc[QB][U];
        #pragma unroll
        for (int u = 0; u < U; ++u) {
          const bool fresh = j0 + u * WARPS == at;
          #pragma unroll
          for (int g = 0; g < QB; ++g) sc[g][u] = 0.0f;
          #pragma unroll
          for (int e = 0; e < E; ++e) {
            const float k = fresh ? head_k[lane * E + e] : kr[u][e];
            #pragma unroll
            for (int g = 0; g < QB; ++g) sc[g][u] += qv[g][e] * k;
          }
        }
        for (int o2 = 16; o2 > 0; o2 >>= 1) {
          #pragma unroll
          for (int g = 0; g < QB; ++g) {
            #pragma unroll
            for (int u = 0; u < U; ++u) sc[g][u] += __shfl_xor_sync(0xffffffffu, sc[g][u], o2);
          }
        }
        #pragma unroll
        for (int g = 0; g < QB; ++g) {
          float m_new = m[g];
          #pragma unroll
          for (int u = 0; u < U; ++u) {
            if (j0 + u * WARPS < end) m_new = fmaxf(m_new, sc[g][u]);
          }
          const float corr = expf(m[g] - m_new);
          l[g] *= corr;
          #pragma unroll
          for (int e = 0; e < E; ++e) acc[g][e] *= corr;
          #pragma unroll
          for (int u = 0; u < U; ++u) {
            if (j0 + u * WARPS >= end) break;
            const bool fresh = j0 + u * WARPS == at;
            const float p = expf(sc[g][u] - m_new);
            l[g] += p;
            #pragma unroll
            for (int e = 0; e < E; ++e) {
              const float v = fresh ? head_v[lane * E + e] : vr[u][e];
              acc[g][e] += p * v;
            }
          }
          m[g] = m_new;
        }
      }
      if (lane == 0) {
        #pragma unroll
        for (int g = 0; g < QB; ++g) {
          part_m[warp * QB + g] = m[g];
          part_l[warp * QB + g] = l[g];
        }
      }
      // The warps' partial outputs, one query head at a time.
      #pragma unroll
      for (int g = 0; g < QB; ++g) {
        #pragma unroll
        for (int e = 0; e < E; ++e) part_o[warp * D + lane * E + e] = acc[g][e];
        __syncthreads();
        float top = -INFINITY;
        for (int w = 0; w < WARPS; ++w) top = fmaxf(top, part_m[w * QB + g]);
        float* split = partials + (static_cast<size_t>(h0 + g) * S + s) * (D + 2);
        for (int d = tid; d < D; d += THREADS) {
          float sum = 0.0f;
          float total = 0.0f;
          for (int w = 0; w < WARPS; ++w) {
            const float mw = part_m[w * QB + g];
            const float f = mw == -INFINITY ? 0.0f : expf(mw - top);
            sum += part_l[w * QB + g] * f;
            total += part_o[w * D + d] * f;
          }
          split[2 + d] = total;
          if (d == 0) {
            split[0] = top;
            split[1] = sum;
          }
        }
        __syncthreads();
      }
      __threadfence();
      __syncthreads();
      if (tid == 0) last_split = atomicAdd(done + group, 1u) == static_cast<unsigned int>(S - 1);
      __syncthreads();
      if (last_split) {
        for (int hd = tid; hd < QB * D; hd += THREADS) {
          const int h = h0 + hd / D;
          const int d = hd % D;
          const float* parts = partials + static_cast<size_t>(h) * S * (D + 2);
          float best = -INFINITY;
          #pragma unroll 8
          for (int k = 0; k < S; ++k) best = fmaxf(best, gemma_load(parts + k * (D + 2)));
          float sum = 0.0f;
          float total = 0.0f;
          #pragma unroll 8
          for (int k = 0; k < S; ++k) {
            const float mk = gemma_load(parts + k * (D + 2));
            const float f = mk == -INFINITY ? 0.0f : expf(mk - best);
            sum += f * gemma_load(parts + k * (D + 2) + 1);
            total += f * gemma_load(parts + k * (D + 2) + 2 + d);
          }
          const T r = static_cast<T>(total / sum);
          if constexpr (VF == 2) head_q[hd] = static_cast<float>(r);
          else attn[h * D + d] = r;
        }
        // TurboQuant values: the output back from their rotated domain.
        if constexpr (VF == 2) {
          __syncthreads();
          gemma_turbo_rotate(head_q, QB * D, GEMMA_TURBO_SIGNS_AFTER, GEMMA_TURBO_SIGNS_BEFORE);
          for (int hd = tid; hd < QB * D; hd += THREADS) attn[h0 * D + hd] = static_cast<T>(head_q[hd]);
        }
        if (tid == 0) atomicExch(done + group, 0u);
      }
      __syncthreads();
    }
  }
  gemma_grid_sync(bar, G);

  // 3. Output projection.
  {
    for (int i = tid; i < HQ * D; i += THREADS) xs[i] = gemma_load(attn + i);
    __syncthreads();
    gemma_rows<PAIR, WARPS>(w_o, H, HQ * D, xs, o);
  }
  gemma_grid_sync(bar, G);

  // 4. h = x + norm(o) (block 0 keeps it), the pre-MLP norm of h (every
  // block, into shared memory), gate and up rows, gated GELU.
  {
    float ss = 0.0f;
    for (int i = tid; i < H; i += THREADS) {
      const float t = static_cast<float>(gemma_load(o + i));
      ss += t * t;
    }
    const float inv = rsqrtf(gemma_block_sum(ss, red) / H + EPS);
    float sh = 0.0f;
    for (int i = tid; i < H; i += THREADS) {
      const T r = w_post_attn[i] * static_cast<T>(static_cast<float>(gemma_load(o + i)) * inv);
      const T v = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(r));
      xs[i] = v;
      if (blockIdx.x == 0) hmid[i] = v;
      const float t = static_cast<float>(v);
      sh += t * t;
    }
    const float inv_h = rsqrtf(gemma_block_sum(sh, red) / H + EPS);
    for (int i = tid; i < H; i += THREADS) {
      xs[i] = w_pre_ffn[i] * static_cast<T>(static_cast<float>(xs[i]) * inv_h);
    }
    __syncthreads();
    for (int j = blockIdx.x + G * warp; j < I; j += G * WARPS) {
      const T* rows[2] = {w_gate_up + static_cast<size_t>(j) * H, w_gate_up + static_cast<size_t>(I + j) * H};
      float gu[2];
      gemma_dots<2>(rows, xs, H, lane, gu);
      if (lane == 0) act[j] = gemma_gated_gelu(static_cast<T>(gu[0]), static_cast<T>(gu[1]));
    }
  }
  gemma_grid_sync(bar, G);

  // 5. Down projection.
  {
    for (int i = tid; i < I; i += THREADS) xs[i] = gemma_load(act + i);
    __syncthreads();
    gemma_rows<PAIR, WARPS>(w_down, H, I, xs, dn);
  }
  gemma_grid_sync(bar, G);

  // 6. out = h + norm(down), each block its share.
  {
    float ss = 0.0f;
    for (int i = tid; i < H; i += THREADS) {
      const float t = static_cast<float>(gemma_load(dn + i));
      ss += t * t;
    }
    const float inv = rsqrtf(gemma_block_sum(ss, red) / H + EPS);
    for (int i = blockIdx.x * THREADS + tid; i < H; i += G * THREADS) {
      const T r = w_post_ffn[i] * static_cast<T>(static_cast<float>(gemma_load(dn + i)) * inv);
      out[i] = static_cast<T>(static_cast<float>(gemma_load(hmid + i)) + static_cast<float>(r));
    }
  }
"#;

/// Query heads that one attention block serves from one read of their
/// key/value head: the most that share it (`heads / kv_heads`, or a divisor
/// of it) while each lane holds at most eight of their features, so that
/// the block's registers suffice.
fn query_heads_per_block(heads: i32, kv_heads: i32, head_dim: i32) -> i32 {
    let shared = if kv_heads > 0 { heads / kv_heads } else { 1 };
    (1..=shared.max(1))
        .rev()
        .find(|&q| shared % q == 0 && q * (head_dim / 32) <= 8)
        .unwrap_or(1)
}

/// Blocks of a [`decode_layer`] launch: one per multiprocessor of the GPU,
/// so that all are resident at once (the kernel's grid barriers need it).
pub fn resident_blocks() -> mlx_core::Result<i32> {
    static COUNT: OnceLock<i32> = OnceLock::new();
    if let Some(&count) = COUNT.get() {
        return Ok(count);
    }
    let count = cuda_multiprocessor_count()?;
    Ok(*COUNT.get_or_init(|| count))
}

/// The counters of [`decode_layer`]'s grid barriers and attention splits,
/// shared by the kernels of one step (each leaves them as it found them).
/// They must not be 8 bytes or less: MLX's CUDA allocator keeps such arrays
/// in a read-mostly pool, where the GPU's atomic additions cost
/// microseconds each (a barrier of 132 blocks took 0.7 ms there).
pub fn grid_barrier() -> mlx_core::Result<Array> {
    mlx_core::zeros(&[32 + MAX_HEADS], Dtype::Int32)
}

/// One block's weights, dense, all of the compute dtype.
#[derive(Debug, Clone, Copy)]
pub struct LayerWeights<'a> {
    /// Input RMSNorm `[H]` (1 + w).
    pub input_norm: &'a Array,
    /// Fused Q/K/V projection `[(Hq + 2·Hkv)·D, H]`.
    pub qkv: &'a Array,
    /// Query head norm `[D]`.
    pub q_norm: &'a Array,
    /// Key head norm `[D]`.
    pub k_norm: &'a Array,
    /// Output projection `[H, Hq·D]`.
    pub o: &'a Array,
    /// Post-attention RMSNorm `[H]`.
    pub post_attention_norm: &'a Array,
    /// Pre-MLP RMSNorm `[H]`.
    pub pre_feedforward_norm: &'a Array,
    /// Fused gate/up projection `[2·I, H]`.
    pub gate_up: &'a Array,
    /// Down projection `[H, I]`.
    pub down: &'a Array,
    /// Post-MLP RMSNorm `[H]`.
    pub post_feedforward_norm: &'a Array,
}

impl<'a> LayerWeights<'a> {
    /// The weights of `layer` as [`decode_layer`] takes them; `None` when a
    /// projection is quantized.
    pub fn of(layer: &'a Layer) -> Option<LayerWeights<'a>> {
        let (Linear::Dense(qkv), Linear::Dense(o), Linear::Dense(gate_up), Linear::Dense(down)) = (
            &layer.qkv_proj,
            &layer.o_proj,
            &layer.gate_up_proj,
            &layer.down_proj,
        ) else {
            return None;
        };
        Some(LayerWeights {
            input_norm: &layer.input_norm,
            qkv,
            q_norm: &layer.q_norm,
            k_norm: &layer.k_norm,
            o,
            post_attention_norm: &layer.post_attention_norm,
            pre_feedforward_norm: &layer.pre_feedforward_norm,
            gate_up,
            down,
            post_feedforward_norm: &layer.post_feedforward_norm,
        })
    }
}

/// The layer kernel's CUDA source as [`decode_layer`] compiles it: its
/// header (device functions and tables) and its body (before the
/// `constexpr` constants `EPS`, `SCALE`, `LOG2_BASE` and `ROPE_SCALE`), with
/// the names of its inputs in order, for tools that time its phases
/// (`xtask/gpu/layer_phases.py`).
pub fn decode_layer_source() -> (String, String, [&'static str; 21]) {
    (
        format!("{HEADER}{}{LAYER_HEADER}", stored_kv::header()),
        DECODE_LAYER.to_string(),
        INPUT_NAMES,
    )
}

/// One decoder block for a single token `x` `[1, 1, H]` as one kernel of
/// `blocks` blocks (at most one per multiprocessor, so that all are resident
/// for the grid barriers). `barrier` is from [`grid_barrier`], shared by the
/// kernels of one step. Writes the token's key and value into the
/// buffers of `kv` in place; returns the block's output `[1, 1, H]`, or
/// `None` when the shapes do not suit the kernel (the caller then runs the
/// block as separate operations).
pub fn decode_layer(
    x: &Array,
    w: &LayerWeights<'_>,
    kv: &LayerKv<'_>,
    g: LayerGeometry,
    barrier: &Array,
    blocks: i32,
) -> mlx_core::Result<Option<Array>> {
    let dtype = x.dtype();
    let (hq, hkv, d) = (g.heads, g.kv_heads, g.head_dim);
    let hidden = w.input_norm.size() as i32;
    let inter = w.down.dim(1)?;
    let bytes = dtype.size_bytes() as i32;
    let (keys, values) = (StoredSide::of(kv.keys), StoredSide::of(kv.values));
    let unused = mlx_core::zeros(&[1], dtype)?;
    let [k_data, k_scales, k_biases] = keys.inputs(&unused);
    let [v_data, v_scales, v_biases] = values.inputs(&unused);
    let inputs = [
        x,
        w.input_norm,
        w.qkv,
        w.q_norm,
        w.k_norm,
        w.o,
        w.post_attention_norm,
        w.pre_feedforward_norm,
        w.gate_up,
        w.down,
        w.post_feedforward_norm,
        kv.position,
        kv.write_at,
        kv.valid,
        k_data,
        k_scales,
        k_biases,
        v_data,
        v_scales,
        v_biases,
        barrier,
    ];
    // The positions and the barrier are int32; the stores as their formats
    // lay them out; everything else `dtype`.
    let dtypes_fit = inputs.iter().zip(INPUT_NAMES).all(|(a, name)| match name {
        "position" | "write_at" | "valid" | "barrier" => a.dtype() == Dtype::Int32,
        name if name.starts_with("k_") || name.starts_with("v_") => true,
        _ => a.dtype() == dtype,
    });
    let store_shape = |data: &Array| data.shape().get(..3).map(<[i32]>::to_vec);
    let widest = hidden.max(inter).max(hq * d) * bytes;
    let shared = widest.max(WARPS * d * 4);
    let qb = query_heads_per_block(hq, hkv, d);
    let fits = dtypes_fit
        && matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16)
        && x.size() as i32 == hidden
        && d % 64 == 0
        && hkv > 0
        && hq % hkv == 0
        && [hidden, inter, hq * d]
            .iter()
            .all(|k| (k * bytes) % 16 == 0)
        && w.qkv.shape() == [(hq + 2 * hkv) * d, hidden]
        && w.o.shape() == [hidden, hq * d]
        && w.gate_up.shape() == [2 * inter, hidden]
        && w.down.shape() == [hidden, inter]
        && k_data.ndim() == 4
        && k_data.dim(0)? == 1
        && k_data.dim(1)? == hkv
        && store_shape(k_data) == store_shape(v_data)
        && keys.suits(dtype, d, WARPS)
        && values.suits(dtype, d, WARPS)
        && qb + 2 <= WARPS
        && shared + 4 * (32 + 2 * WARPS * qb + qb * d + 3 * d + d / 8) + 2 * d * bytes + 2 * d + 16
            <= SHARED_LIMIT
        && hq <= MAX_HEADS
        && blocks > 0;
    if !fits {
        return Ok(None);
    }
    let splits = (blocks / (hq / qb)).max(1);
    let scratch = (hq + 2 * hkv) * d + hq * d + 3 * hidden + inter;
    let kernel = kernel_with_header(
        "gemma_decode_layer",
        (&INPUT_NAMES, &["out", "scratch", "partials"]),
        DECODE_LAYER,
        &decode_layer_source().0,
        &[
            ("EPS", g.eps),
            ("SCALE", g.scale),
            ("LOG2_BASE", g.rope_base.log2()),
            ("ROPE_SCALE", g.rope_scale),
        ],
    )?;
    let out = kernel.apply(
        &inputs,
        &[
            OutputSpec {
                shape: x.shape(),
                dtype,
            },
            OutputSpec {
                shape: vec![scratch],
                dtype,
            },
            OutputSpec {
                shape: vec![hq * splits * (d + 2)],
                dtype: Dtype::Float32,
            },
        ],
        Launch {
            grid: [blocks * WARPS * 32, 1, 1],
            block: [WARPS * 32, 1, 1],
        },
        &[
            ("T", TemplateArg::Dtype(dtype)),
            ("D", TemplateArg::Int(d)),
            ("HQ", TemplateArg::Int(hq)),
            ("HKV", TemplateArg::Int(hkv)),
            ("QB", TemplateArg::Int(qb)),
            ("PAIR", TemplateArg::Int(i32::from(PAIR_ROWS))),
            ("WARPS", TemplateArg::Int(WARPS)),
            ("SMEM", TemplateArg::Int((shared + 15) / 16 * 16)),
        ]
        .into_iter()
        .chain(keys.template_args(["KF", "KB", "KG"]))
        .chain(values.template_args(["VF", "VB", "VG"]))
        .collect::<Vec<_>>(),
    )?;
    // The scratch outputs are dropped: MLX frees them once the kernel ran.
    let mut out = out;
    out.truncate(1);
    Ok(Some(one(out, "decode layer")?))
}

#[cfg(test)]
mod tests {
    use super::query_heads_per_block;

    #[test]
    fn attention_blocks_share_a_key_value_head_as_far_as_registers_allow() {
        // 27B: 32 query heads over 16 key/value heads of 128 (4 features a
        // lane): both query heads of a pair in one block.
        assert_eq!(query_heads_per_block(32, 16, 128), 2);
        // 270M and 1B: 4 query heads over 1 of 256 (8 features a lane):
        // one query head per block.
        assert_eq!(query_heads_per_block(4, 1, 256), 1);
        // 8 query heads over 1 of 64 (2 a lane): 4 fit, 8 do not.
        assert_eq!(query_heads_per_block(8, 1, 64), 4);
        // 6 over 1 of 64: the largest divisor of 6 that fits is 3.
        assert_eq!(query_heads_per_block(6, 1, 64), 3);
        // Degenerate layouts fall back to one query head per block.
        assert_eq!(query_heads_per_block(4, 0, 64), 1);
        assert_eq!(query_heads_per_block(4, 2, 512), 1);
    }
}
