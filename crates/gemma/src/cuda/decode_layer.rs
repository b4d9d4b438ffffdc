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

use super::mma_rows;
use super::program::{kernel_with_header, one, HEADER};
use super::stored_kv::{self, StoredSide};
use super::weight_rows::{self, WeightRows};
use crate::cache::LayerKv;
use crate::model::{Layer, LayerGeometry};

/// Warps per block.
const WARPS: i32 = 16;

/// Whether each warp of the single-row projections (Q/K/V, output, down)
/// reads two of its rows at once (27B on the H200: 58.4, 59.2 → 60.5,
/// 60.1 tok/s with the rows dealt to blocks in turn, against 59.4, 59.6
/// without; the kernel 234.7 → 232.0 µs).
const PAIR_ROWS: bool = true;

/// The largest static shared memory of a kernel, in bytes, and the most
/// static and dynamic shared memory a block may have without raising the
/// kernel's limit.
const SHARED_LIMIT: i32 = 48 * 1024;

/// The most shared memory a block may have once the kernel's limit is
/// raised on the GPUs this kernel is written for (sm_86 and sm_89: 99 KiB;
/// sm_80 163 KiB, sm_90 227 KiB).
const RAISED_SHARED_LIMIT: i32 = 99 * 1024;

/// MLX raises a kernel's shared-memory limit only where more dynamic shared
/// memory than this is asked for.
const MLX_RAISES_ABOVE: i32 = 48_000;

/// The kernel's inputs, in order. Each projection part's rows come with
/// their scales and biases (MLX affine rows; a placeholder otherwise); a
/// fused matrix is handed in as each of its parts.
const INPUT_NAMES: [&str; 38] = [
    "x",
    "w_in",
    "w_q",
    "w_q_s",
    "w_q_b",
    "w_k",
    "w_k_s",
    "w_k_b",
    "w_v",
    "w_v_s",
    "w_v_b",
    "q_norm",
    "k_norm",
    "w_o",
    "w_o_s",
    "w_o_b",
    "w_post_attn",
    "w_pre_ffn",
    "w_gate",
    "w_gate_s",
    "w_gate_b",
    "w_up",
    "w_up_s",
    "w_up_b",
    "w_down",
    "w_down_s",
    "w_down_b",
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

// Rows 0 … N − 1 of a projection in up to three parts (rows below N0 from
// part 0, below N0 + N1 from part 1, the rest from part 2, each part's rows
// from its row offset O in its array, in format F with bits B and group G)
// dotted with the block's `xs` (`K` values) into `out`, rounded to `U`.
// Rows are dealt to the blocks in turn, then to their warps, as in
// `gemma_rows`; a warp reads one row at a time.
template <int F0, int B0, int G0, int O0, int F1, int B1, int G1, int O1, int F2, int B2, int G2, int O2,
          int WARPS_, typename U, typename P0, typename S0, typename P1, typename S1, typename P2, typename S2>
__device__ __forceinline__ void gemma_part_rows(
    const P0* d0, const S0* s0, const S0* b0, int N0, const P1* d1, const S1* s1, const S1* b1, int N1,
    const P2* d2, const S2* s2, const S2* b2, int N, int K, const U* xs, U* out) {
  const int lane = threadIdx.x & 31;
  const int first = blockIdx.x + gridDim.x * (threadIdx.x >> 5);
  const int step = gridDim.x * WARPS_;
  for (int n = first; n < N; n += step) {
    float acc;
    if (n < N0) {
      acc = gemma_wdot_lane<F0, B0, G0, S0>(d0, s0, b0, O0 + n, K, xs, lane);
    } else if (n < N0 + N1) {
      acc = gemma_wdot_lane<F1, B1, G1, S1>(d1, s1, b1, O1 + n - N0, K, xs, lane);
    } else {
      acc = gemma_wdot_lane<F2, B2, G2, S2>(d2, s2, b2, O2 + n - N0 - N1, K, xs, lane);
    }
    acc = gemma_rows_sum(acc);
    if (lane == 0) out[n] = static_cast<U>(acc);
  }
}

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

// The tiles of 16 rows a block takes of `tiles` (tile i to block i mod G),
// in rounds of at most WARPS_: round r's tiles are `first` … `first + here
// − 1` of the block's, each read by `slices` warps (warp w: tile w / slices,
// slice w mod slices of its units, as gemma_mma_tile deals them), whose sums
// meet in `parts`.
struct gemma_mma_round {
  int here;
  int slices;
  __device__ __forceinline__ int tile(int local, int first) const {
    return static_cast<int>(blockIdx.x + gridDim.x * (first + local));
  }
};
__device__ __forceinline__ int gemma_mma_tiles_of_block(int tiles) {
  const int b = static_cast<int>(blockIdx.x), g = static_cast<int>(gridDim.x);
  return tiles > b ? (tiles - b + g - 1) / g : 0;
}
template <int WARPS_>
__device__ __forceinline__ gemma_mma_round gemma_mma_round_at(int mine, int first) {
  const int here = mine - first < WARPS_ ? mine - first : WARPS_;
  return gemma_mma_round{here, WARPS_ / here};
}

// Rows 0 … N − 1 of a projection in up to three parts (as gemma_part_rows;
// every part's rows a multiple of 16, every format with a tensor-core
// reader) dotted with the activations of gemma_mma_activations (`down` its
// scale back) into `out`, rounded to `U`, 16 rows a warp at a time.
template <int F0, int B0, int G0, int O0, int F1, int B1, int G1, int O1, int F2, int B2, int G2, int O2,
          int WARPS_, typename U, typename P0, typename S0, typename P1, typename S1, typename P2, typename S2>
__device__ __forceinline__ void gemma_mma_part_rows(const P0* d0, const S0* s0, const S0* b0, int N0, const P1* d1,
                                                    const S1* s1, const S1* b1, int N1, const P2* d2, const S2* s2,
                                                    const S2* b2, int N, int K, const unsigned short* xh,
                                                    const float* xsum, float down, float* parts, U* out) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int mine = gemma_mma_tiles_of_block(N / 16);
  for (int first = 0; first < mine; first += WARPS_) {
    const gemma_mma_round round = gemma_mma_round_at<WARPS_>(mine, first);
    const int local = warp / round.slices;
    if (local < round.here) {
      const int n = 16 * round.tile(local, first);
      const int slice = warp % round.slices;
      float acc[2] = {0.0f, 0.0f};
      if (n < N0) {
        gemma_mma_tile<F0, B0, G0>(d0, s0, b0, O0 + n, K, slice, round.slices, xh, xsum, lane, acc);
      } else if (n < N0 + N1) {
        gemma_mma_tile<F1, B1, G1>(d1, s1, b1, O1 + n - N0, K, slice, round.slices, xh, xsum, lane, acc);
      } else {
        gemma_mma_tile<F2, B2, G2>(d2, s2, b2, O2 + n - N0 - N1, K, slice, round.slices, xh, xsum, lane, acc);
      }
      if ((lane & 3) == 0) {
        parts[16 * warp + (lane >> 2)] = acc[0];
        parts[16 * warp + (lane >> 2) + 8] = acc[1];
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * round.here; i += blockDim.x) {
      const int tile = i >> 4, r = i & 15;
      float s = 0.0f;
      for (int k = 0; k < round.slices; ++k) s += parts[16 * (tile * round.slices + k) + r];
      out[16 * round.tile(tile, first) + r] = static_cast<U>(s * down);
    }
    __syncthreads();
  }
}

// The gated MLP's gate and up rows on the tensor cores (as
// gemma_mma_part_rows, a warp 16 gate rows and their 16 up rows), the
// gated GELU of each pair into `act`.
template <int FG, int BG, int GG, int OG, int FU, int BU, int GU, int OU, int WARPS_, typename U, typename PG,
          typename SG, typename PU, typename SU>
__device__ __forceinline__ void gemma_mma_gate_up(const PG* gate, const SG* gate_s, const SG* gate_b, const PU* up,
                                                  const SU* up_s, const SU* up_b, int I, int K,
                                                  const unsigned short* xh, const float* xsum, float down,
                                                  float* parts, U* act) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int mine = gemma_mma_tiles_of_block(I / 16);
  for (int first = 0; first < mine; first += WARPS_) {
    const gemma_mma_round round = gemma_mma_round_at<WARPS_>(mine, first);
    const int local = warp / round.slices;
    if (local < round.here) {
      const int n = 16 * round.tile(local, first);
      const int slice = warp % round.slices;
      float g[2] = {0.0f, 0.0f}, u[2] = {0.0f, 0.0f};
      gemma_mma_tile<FG, BG, GG>(gate, gate_s, gate_b, OG + n, K, slice, round.slices, xh, xsum, lane, g);
      gemma_mma_tile<FU, BU, GU>(up, up_s, up_b, OU + n, K, slice, round.slices, xh, xsum, lane, u);
      if ((lane & 3) == 0) {
        float* p = parts + 32 * warp + (lane >> 2);
        p[0] = g[0];
        p[8] = g[1];
        p[16] = u[0];
        p[24] = u[1];
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * round.here; i += blockDim.x) {
      const int tile = i >> 4, r = i & 15;
      float sg = 0.0f, su = 0.0f;
      for (int k = 0; k < round.slices; ++k) {
        sg += parts[32 * (tile * round.slices + k) + r];
        su += parts[32 * (tile * round.slices + k) + 16 + r];
      }
      act[16 * round.tile(tile, first) + r] =
          gemma_gated_gelu(static_cast<U>(sg * down), static_cast<U>(su * down));
    }
    __syncthreads();
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
  extern __shared__ __align__(16) unsigned char smem[];
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
  __shared__ __align__(16) float mma_xsum[MMA ? SMEM / 32 : 1];
  __shared__ float mma_parts[MMA ? 32 * WARPS : 1];
  T* xs = reinterpret_cast<T*>(smem);
  const unsigned short* xh = reinterpret_cast<const unsigned short*>(smem);
  const int G = gridDim.x;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int H = w_in_shape[0];
  const int I = INTER;
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
    if constexpr (gemma_mma_on(MMA, WQF) && gemma_mma_on(MMA, WKF) &&
                  gemma_mma_on(MMA, WVF)) {
      const float down = gemma_mma_activations(xs, H, mma_xsum, red);
      gemma_mma_part_rows<WQF, WQB, WQG, WQO, WKF, WKB, WKG, WKO, WVF, WVB, WVG, WVO, WARPS>(
          w_q, w_q_s, w_q_b, HQ * D, w_k, w_k_s, w_k_b, HKV * D, w_v, w_v_s, w_v_b, NQKV, H, xh, mma_xsum, down,
          mma_parts, qkv);
    } else if constexpr (WQF == 0 && WKF == 0 && WVF == 0) {
      gemma_rows<PAIR, WARPS>(reinterpret_cast<const T*>(w_q), NQKV, H, xs, qkv);
    } else {
      gemma_part_rows<WQF, WQB, WQG, WQO, WKF, WKB, WKG, WKO, WVF, WVB, WVG, WVO, WARPS>(
          w_q, w_q_s, w_q_b, HQ * D, w_k, w_k_s, w_k_b, HKV * D, w_v, w_v_s, w_v_b, NQKV, H, xs, qkv);
    }
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
    if constexpr (gemma_mma_on(MMA, WOF)) {
      const float down = gemma_mma_activations(xs, HQ * D, mma_xsum, red);
      gemma_mma_part_rows<WOF, WOB, WOG, 0, WOF, WOB, WOG, 0, WOF, WOB, WOG, 0, WARPS>(
          w_o, w_o_s, w_o_b, H, w_o, w_o_s, w_o_b, 0, w_o, w_o_s, w_o_b, H, HQ * D, xh, mma_xsum, down, mma_parts, o);
    } else if constexpr (WOF == 0) {
      gemma_rows<PAIR, WARPS>(reinterpret_cast<const T*>(w_o), H, HQ * D, xs, o);
    } else {
      gemma_part_rows<WOF, WOB, WOG, 0, WOF, WOB, WOG, 0, WOF, WOB, WOG, 0, WARPS>(
          w_o, w_o_s, w_o_b, H, w_o, w_o_s, w_o_b, 0, w_o, w_o_s, w_o_b, H, HQ * D, xs, o);
    }
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
    if constexpr (gemma_mma_on(MMA, WGF) && gemma_mma_on(MMA, WUF)) {
      const float down = gemma_mma_activations(xs, H, mma_xsum, red);
      gemma_mma_gate_up<WGF, WGB, WGG, WGO, WUF, WUB, WUG, WUO, WARPS>(w_gate, w_gate_s, w_gate_b, w_up, w_up_s, w_up_b,
                                                                      I, H, xh, mma_xsum, down, mma_parts, act);
    } else {
      for (int j = blockIdx.x + G * warp; j < I; j += G * WARPS) {
        float gu[2];
        if constexpr (WGF == 0 && WUF == 0) {
          const T* gate_up = reinterpret_cast<const T*>(w_gate);
          const T* rows[2] = {gate_up + static_cast<size_t>(j) * H, gate_up + static_cast<size_t>(I + j) * H};
          gemma_dots<2>(rows, xs, H, lane, gu);
        } else {
          gu[0] = gemma_rows_sum(gemma_wdot_lane<WGF, WGB, WGG>(w_gate, w_gate_s, w_gate_b, WGO + j, H, xs, lane));
          gu[1] = gemma_rows_sum(gemma_wdot_lane<WUF, WUB, WUG>(w_up, w_up_s, w_up_b, WUO + j, H, xs, lane));
        }
        if (lane == 0) act[j] = gemma_gated_gelu(static_cast<T>(gu[0]), static_cast<T>(gu[1]));
      }
    }
  }
  gemma_grid_sync(bar, G);

  // 5. Down projection.
  {
    for (int i = tid; i < I; i += THREADS) xs[i] = gemma_load(act + i);
    __syncthreads();
    if constexpr (gemma_mma_on(MMA, WDF)) {
      const float down = gemma_mma_activations(xs, I, mma_xsum, red);
      gemma_mma_part_rows<WDF, WDB, WDG, 0, WDF, WDB, WDG, 0, WDF, WDB, WDG, 0, WARPS>(
          w_down, w_down_s, w_down_b, H, w_down, w_down_s, w_down_b, 0, w_down, w_down_s, w_down_b, H, I, xh, mma_xsum,
          down, mma_parts, dn);
    } else if constexpr (WDF == 0) {
      gemma_rows<PAIR, WARPS>(reinterpret_cast<const T*>(w_down), H, I, xs, dn);
    } else {
      gemma_part_rows<WDF, WDB, WDG, 0, WDF, WDB, WDG, 0, WDF, WDB, WDG, 0, WARPS>(
          w_down, w_down_s, w_down_b, H, w_down, w_down_s, w_down_b, 0, w_down, w_down_s, w_down_b, H, I, xs, dn);
    }
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

/// One block's weights as [`decode_layer`] reads them: norms of the compute
/// dtype, projections in any format of [`WeightRows`].
#[derive(Debug, Clone, Copy)]
pub struct LayerWeights<'a> {
    /// Input RMSNorm `[H]` (1 + w).
    pub input_norm: &'a Array,
    /// The Q, K and V rows (`[Hq·D, H]`, `[Hkv·D, H]` twice), each with its
    /// first row in its array (a fused matrix is each of its parts).
    pub qkv: [(WeightRows<'a>, i32); 3],
    /// Query head norm `[D]`.
    pub q_norm: &'a Array,
    /// Key head norm `[D]`.
    pub k_norm: &'a Array,
    /// Output projection `[H, Hq·D]`.
    pub o: WeightRows<'a>,
    /// Post-attention RMSNorm `[H]`.
    pub post_attention_norm: &'a Array,
    /// Pre-MLP RMSNorm `[H]`.
    pub pre_feedforward_norm: &'a Array,
    /// The gate and up rows (`[I, H]` each), each with its first row.
    pub gate_up: [(WeightRows<'a>, i32); 2],
    /// Down projection `[H, I]`.
    pub down: WeightRows<'a>,
    /// Post-MLP RMSNorm `[H]`.
    pub post_feedforward_norm: &'a Array,
}

impl<'a> LayerWeights<'a> {
    /// The weights of `layer` (head layout `g`) as [`decode_layer`] takes
    /// them in `dtype`; `None` where a projection is in a format it does
    /// not read.
    pub fn of(
        layer: &'a Layer,
        g: LayerGeometry,
        dtype: Dtype,
    ) -> mlx_core::Result<Option<LayerWeights<'a>>> {
        let (hq, hkv, d) = (g.heads, g.kv_heads, g.head_dim);
        let inter = layer.gate_up_proj.out_rows()? / 2;
        let qkv = WeightRows::parts(&layer.qkv_proj, &[hq * d, hkv * d, hkv * d], dtype)?;
        let gate_up = WeightRows::parts(&layer.gate_up_proj, &[inter, inter], dtype)?;
        let o = WeightRows::of(&layer.o_proj, dtype)?;
        let down = WeightRows::of(&layer.down_proj, dtype)?;
        let (Some(qkv), Some(gate_up), Some(o), Some(down)) = (qkv, gate_up, o, down) else {
            return Ok(None);
        };
        let (Ok(qkv), Ok(gate_up)) = (
            <[(WeightRows<'a>, i32); 3]>::try_from(qkv),
            <[(WeightRows<'a>, i32); 2]>::try_from(gate_up),
        ) else {
            return Ok(None);
        };
        Ok(Some(LayerWeights {
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
        }))
    }

    /// The projection parts in kernel order (Q, K, V, output, gate, up,
    /// down), with their first rows.
    fn parts(&self) -> [(WeightRows<'a>, i32); 7] {
        let [q, k, v] = self.qkv;
        let [gate, up] = self.gate_up;
        [q, k, v, (self.o, 0), gate, up, (self.down, 0)]
    }
}

/// The layer kernel's CUDA source as [`decode_layer`] compiles it: its
/// header (device functions and tables) and its body (before the
/// `constexpr` constants `EPS`, `SCALE`, `LOG2_BASE` and `ROPE_SCALE`), with
/// the names of its inputs in order, for tools that time its phases
/// (`xtask/gpu/layer_phases.py`).
pub fn decode_layer_source() -> (String, String, [&'static str; 38]) {
    (
        format!(
            "{HEADER}{}{}{}{LAYER_HEADER}",
            stored_kv::header(),
            weight_rows::HEADER,
            mma_rows::HEADER
        ),
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
    let inter = w.down.cols;
    let bytes = dtype.size_bytes() as i32;
    let (keys, values) = (StoredSide::of(kv.keys), StoredSide::of(kv.values));
    let unused = mlx_core::zeros(&[1], dtype)?;
    let [k_data, k_scales, k_biases] = keys.inputs(&unused);
    let [v_data, v_scales, v_biases] = values.inputs(&unused);
    let parts = w.parts();
    let [q, k, v, o, gate, up, down] = parts.map(|(rows, _)| rows.inputs(&unused));
    let inputs = [
        x,
        w.input_norm,
        q[0],
        q[1],
        q[2],
        k[0],
        k[1],
        k[2],
        v[0],
        v[1],
        v[2],
        w.q_norm,
        w.k_norm,
        o[0],
        o[1],
        o[2],
        w.post_attention_norm,
        w.pre_feedforward_norm,
        gate[0],
        gate[1],
        gate[2],
        up[0],
        up[1],
        up[2],
        down[0],
        down[1],
        down[2],
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
    // The positions and the barrier are int32; the stores and the
    // projections as their formats lay them out; everything else `dtype`.
    let dtypes_fit = inputs.iter().zip(INPUT_NAMES).all(|(a, name)| match name {
        "position" | "write_at" | "valid" | "barrier" => a.dtype() == Dtype::Int32,
        "w_in" | "w_post_attn" | "w_pre_ffn" | "w_post_ffn" => a.dtype() == dtype,
        name if name.starts_with("k_") || name.starts_with("v_") || name.starts_with("w_") => true,
        _ => a.dtype() == dtype,
    });
    // Each part's rows and columns, and its first row within its array.
    let shapes = [
        (hq * d, hidden),
        (hkv * d, hidden),
        (hkv * d, hidden),
        (hidden, hq * d),
        (inter, hidden),
        (inter, hidden),
        (hidden, inter),
    ];
    let parts_fit = parts.iter().zip(shapes).all(|((rows, first), (n, k))| {
        rows.suits(dtype) && rows.cols == k && first + n <= rows.rows && *first >= 0
    });
    let store_shape = |data: &Array| data.shape().get(..3).map(<[i32]>::to_vec);
    let qb = query_heads_per_block(hq, hkv, d);
    let plan = SharedPlan::of(hidden, inter, hq * d, d, qb, bytes);
    let fits = dtypes_fit
        && matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16)
        && x.size() as i32 == hidden
        && d % 64 == 0
        && hkv > 0
        && hq % hkv == 0
        && [hidden, inter, hq * d]
            .iter()
            .all(|k| (k * bytes) % 16 == 0)
        && parts_fit
        && k_data.ndim() == 4
        && k_data.dim(0)? == 1
        && k_data.dim(1)? == hkv
        && store_shape(k_data) == store_shape(v_data)
        && keys.suits(dtype, d, WARPS)
        && values.suits(dtype, d, WARPS)
        && qb + 2 <= WARPS
        && plan.fits()
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
            shared_bytes: plan.dynamic,
        },
        &[
            ("T", TemplateArg::Dtype(dtype)),
            ("D", TemplateArg::Int(d)),
            ("HQ", TemplateArg::Int(hq)),
            ("HKV", TemplateArg::Int(hkv)),
            ("QB", TemplateArg::Int(qb)),
            ("PAIR", TemplateArg::Int(i32::from(PAIR_ROWS))),
            ("WARPS", TemplateArg::Int(WARPS)),
            ("SMEM", TemplateArg::Int(plan.smem)),
            (
                "MMA",
                TemplateArg::Int(if plan.tensor_cores {
                    mma_rows::tensor_core_formats(hidden)
                } else {
                    0
                }),
            ),
        ]
        .into_iter()
        .chain(keys.template_args(["KF", "KB", "KG"]))
        .chain(values.template_args(["VF", "VB", "VG"]))
        .chain(part_args(&parts))
        .chain([("INTER", TemplateArg::Int(inter))])
        .collect::<Vec<_>>(),
    )?;
    // The scratch outputs are dropped: MLX frees them once the kernel ran.
    let mut out = out;
    out.truncate(1);
    Ok(Some(one(out, "decode layer")?))
}

/// The fused layer's shared memory for a model's shapes: dynamic, the
/// activations' buffer `SMEM` (the widest of a phase's activations, or the
/// attention warps' partial outputs); static, attention's arrays and, where
/// they fit, the tensor-core readers' sums of 16 activations and their
/// warps' partial sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SharedPlan {
    /// Bytes of the activations' buffer.
    smem: i32,
    /// Whether the tensor-core readers' arrays fit.
    tensor_cores: bool,
    /// Static bytes of a block.
    static_bytes: i32,
    /// Dynamic bytes asked for at launch: `smem`, or more where the kernel's
    /// limit must be raised (past 48 KiB in all), which MLX does only for
    /// more than [`MLX_RAISES_ABOVE`].
    dynamic: i32,
}

impl SharedPlan {
    /// The plan for `hidden` and `inter` values a token, `q_width` query
    /// features, head size `d`, `qb` query heads a block and activations of
    /// `bytes` bytes.
    fn of(hidden: i32, inter: i32, q_width: i32, d: i32, qb: i32, bytes: i32) -> SharedPlan {
        let widest = hidden.max(inter).max(q_width) * bytes;
        let smem = (widest.max(WARPS * d * 4) + 15) / 16 * 16;
        let attention =
            4 * (32 + 2 * WARPS * qb + qb * d + 3 * d + d / 8) + 2 * d * bytes + 2 * d + 16;
        let mma = smem / 8 + 128 * WARPS;
        let with_readers = SharedPlan::laid_out(smem, attention + mma, true);
        if bytes == 2 && hidden % 16 == 0 && with_readers.fits() {
            with_readers
        } else {
            // The readers' arrays left at one float each.
            SharedPlan::laid_out(smem, attention + 8, false)
        }
    }

    /// The plan of `smem` dynamic and `static_bytes` static bytes.
    fn laid_out(smem: i32, static_bytes: i32, tensor_cores: bool) -> SharedPlan {
        let dynamic = if smem + static_bytes > SHARED_LIMIT {
            smem.max(MLX_RAISES_ABOVE + 1)
        } else {
            smem
        };
        SharedPlan {
            smem,
            tensor_cores,
            static_bytes,
            dynamic,
        }
    }

    /// Whether a block's shared memory fits the limits.
    fn fits(&self) -> bool {
        self.static_bytes <= SHARED_LIMIT && self.dynamic + self.static_bytes <= RAISED_SHARED_LIMIT
    }
}

/// The template arguments of the projection parts (see [`INPUT_NAMES`]):
/// each part's format, bits and group, and the first rows of the Q/K/V and
/// gate/up parts.
fn part_args(parts: &[(WeightRows<'_>, i32); 7]) -> Vec<(&'static str, TemplateArg)> {
    const NAMES: [[&str; 4]; 7] = [
        ["WQF", "WQB", "WQG", "WQO"],
        ["WKF", "WKB", "WKG", "WKO"],
        ["WVF", "WVB", "WVG", "WVO"],
        ["WOF", "WOB", "WOG", ""],
        ["WGF", "WGB", "WGG", "WGO"],
        ["WUF", "WUB", "WUG", "WUO"],
        ["WDF", "WDB", "WDG", ""],
    ];
    let mut args = Vec::new();
    for ((rows, first), [f, b, g, o]) in parts.iter().zip(NAMES) {
        args.extend(rows.template_args([f, b, g]));
        if !o.is_empty() {
            args.push((o, TemplateArg::Int(*first)));
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::{query_heads_per_block, SharedPlan, MLX_RAISES_ABOVE};

    #[test]
    fn the_tensor_core_readers_fit_every_gemma_size_in_bfloat16() {
        // 27B (hidden 5376, intermediate 21504, 32 × 128 query features, 2
        // query heads a block): 43,008 bytes of activations; with the
        // readers' 7,424 static bytes the block passes 48 KiB, so its
        // limit is raised (the activations' buffer was static before, and
        // the readers were left out at 27B).
        let p27 = SharedPlan::of(5376, 21504, 4096, 128, 2, 2);
        assert_eq!(p27.smem, 43_008);
        assert!(p27.tensor_cores && p27.fits());
        assert_eq!(p27.dynamic, MLX_RAISES_ABOVE + 1);
        // 12B and 1B stay under 48 KiB: no more than the buffer is asked.
        let p12 = SharedPlan::of(3840, 15360, 4096, 256, 1, 2);
        assert!(p12.tensor_cores && p12.fits());
        assert_eq!(p12.dynamic, 30_720);
        assert_eq!(SharedPlan::of(1152, 6912, 1024, 256, 1, 2).dynamic, 16_384);
        // Float32 activations: no tensor-core readers; 27B's 86,016 bytes
        // fit once the limit is raised.
        let f27 = SharedPlan::of(5376, 21504, 4096, 128, 2, 4);
        assert!(!f27.tensor_cores && f27.fits());
        assert_eq!(f27.dynamic, 86_016);
        // Past the raised limit nothing fits.
        assert!(!SharedPlan::of(5376, 65536, 4096, 128, 2, 4).fits());
    }

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
