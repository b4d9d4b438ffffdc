//! Projections of ggml blocks and MLX affine rows on the tensor cores: a
//! warp multiplies 16 rows at a time by the activations with `mma.sync`
//! (float16 operands, float32 sums), each lane decoding its share of two
//! rows in registers.
//!
//! The scalar readers of `weight_rows` spend about ten instructions on a
//! weight (decode, widen, multiply-add, one lane a value), so that 12B's
//! quantized decode was bound by instructions, not by the bytes it reads.
//! Here the codes enter the tensor cores as float16 `1024 + q` (`q`, or
//! `16·q` for a high nibble, placed in the mantissa by a mask or a byte
//! permutation), one `mma` takes 256 products of 16 rows, and each block's
//! or sub-block's scale is applied to its sum once: `Σ w·x = a·Σ q·x + b·Σ x`
//! for values `w = a·q + b`, with `Σ (1024 + q)·x = Σ q·x + 1024·Σ x`.
//!
//! Operands (PTX's `mma.m16n8k16` fragments): lane `4g + t` gives rows `g`
//! and `g + 8` of the tile (registers 0, 2 and 1, 3) and the activations
//! of its `t` for every column (all 8 columns equal, so the sum of row `g`
//! lands in register 0 of every lane of group `g`, that of row `g + 8` in
//! register 2). The 16 values an `mma` takes from a row need not be
//! consecutive, only the same for every row and for the activations:
//! lane `t` takes positions `p … p + 3` of a group of 16 or 32 values, as
//! the pairs `(p, p + 2)` and `(p + 1, p + 3)`, which is how the byte
//! permutations and nibble masks pair a word's bytes.
//!
//! The activations are float16 `x·2^e` (one power of two for the vector,
//! putting its largest magnitude in `[2^14, 2^15)`: every bfloat16 value
//! in range stays exact), each aligned four stored as `p, p + 2, p + 1,
//! p + 3`, with the sum of every 16 (`gemma_mma_put4` for four of them).
//! Test `cuda_host` runs these device functions on the host, a warp as 32
//! threads meeting at each `mma`, against the crate's dequantizer and
//! affine rows' values `scale·q + bias`.

use std::sync::OnceLock;

/// The device functions: per format a reader of a lane's share of a tile's
/// two rows (`load` the bytes of one unit of values, `dot` them with the
/// activations into the two rows' sums), and the tile loop
/// `gemma_mma_tile`.
pub(super) const HEADER: &str = r#"
// Whether format WF is read on the tensor cores: a ggml block type (1-6)
// or MLX affine rows (7) whose bit is set in `mask`.
__device__ constexpr bool gemma_mma_on(int mask, int wf) { return wf >= 1 && wf <= 7 && ((mask >> wf) & 1) != 0; }

// D = A·B + D for one m16n8k16 step: float16 operands, float32 sums.
#ifdef __CUDA_ARCH__
__device__ __forceinline__ void gemma_mma_f16(float (&c)[4], const unsigned int (&a)[4], const unsigned int (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// Activations 4q … 4q + 3 of `xs` (a type of 2 bytes) rewritten in place as
// float16 values x·up (`up` a power of two) in the order 4q, 4q + 2, 4q + 1,
// 4q + 3; returns the sum of the values as written.
template <typename T>
__device__ __forceinline__ float gemma_mma_put4(T* xs, int q, float up) {
  float v[4];
  #pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = static_cast<float>(xs[4 * q + k]) * up;
  const unsigned short h[4] = {__half_as_ushort(__float2half_rn(v[0])), __half_as_ushort(__float2half_rn(v[2])),
                               __half_as_ushort(__float2half_rn(v[1])), __half_as_ushort(__float2half_rn(v[3]))};
  unsigned short* out = reinterpret_cast<unsigned short*>(xs) + 4 * q;
  #pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = h[k];
  return (gemma_f16_bits(h[0]) + gemma_f16_bits(h[1])) + (gemma_f16_bits(h[2]) + gemma_f16_bits(h[3]));
}

// The exponent e of gemma_mma_put4's scale 2^e for activations whose
// largest magnitude is m: m·2^e in [2^14, 2^15); 0 for zero or non-finite m.
__device__ __forceinline__ int gemma_mma_exponent(float m) {
  if (!(m > 0.0f) || !(m <= 3.4e38f)) return 0;
  int k;
  frexpf(m, &k);
  const int e = 15 - k;
  return e < -120 ? -120 : (e > 120 ? 120 : e);
}

// The float 2^e (|e| ≤ 126).
__device__ __forceinline__ float gemma_pow2(int e) { return __int_as_float((127 + e) << 23); }

// The largest of every thread's `v` (every thread gets it).
__device__ __forceinline__ float gemma_block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
  return t;
}

// The block's `K` activations `xs` (K a multiple of 32) made the operands of
// the tensor-core readers in place (gemma_mma_put4: float16 values x·2^e,
// the largest magnitude in [2^14, 2^15)), with the sum of every 16 in
// `xsum`; returns 2^−e, which scales their products back.
template <typename T>
__device__ __forceinline__ float gemma_mma_activations(T* xs, int K, float* xsum, float* red) {
  float m = 0.0f;
  for (int i = threadIdx.x; i < K; i += blockDim.x) m = fmaxf(m, fabsf(static_cast<float>(xs[i])));
  const int e = gemma_mma_exponent(gemma_block_max(m, red));
  const float up = gemma_pow2(e);
  for (int base = 0; base < K / 4; base += blockDim.x) {
    const int q = base + threadIdx.x;
    float s = q < K / 4 ? gemma_mma_put4(xs, q, up) : 0.0f;
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    if (q < K / 4 && (q & 3) == 0) xsum[q / 4] = s;
  }
  __syncthreads();
  return gemma_pow2(-e);
}

// Float16 pairs (1024 + byte 0, 1024 + byte 2) and (1024 + byte 1, 1024 + byte 3) of w.
__device__ __forceinline__ unsigned int gemma_h_even(unsigned int w) { return __byte_perm(w, 0x64646464u, 0x4240); }
__device__ __forceinline__ unsigned int gemma_h_odd(unsigned int w) { return __byte_perm(w, 0x64646464u, 0x4341); }

// Float16 pairs of bytes 0 and 2 of w: 1024 + low nibble, 1024 + 16·high nibble.
__device__ __forceinline__ unsigned int gemma_h_low(unsigned int w) { return (w & 0x000F000Fu) | 0x64006400u; }
__device__ __forceinline__ unsigned int gemma_h_high(unsigned int w) { return (w & 0x00F000F0u) | 0x64006400u; }

// A block's bytes from aligned 4-byte loads through the read-only cache,
// for blocks aligned to 2 only: `words` is the block's first byte rounded
// down to 4, `next` the same plus 1 where the block starts 2 bytes off a
// 4-byte edge (`odd`), so that `word(o / 4)` is the word at byte `o` (a
// multiple of 4) of the block and `half(o / 4)` its first two bytes, reading
// no word but those that hold them.
struct gemma_a2 {
  const unsigned int* words;
  const unsigned int* next;
  int odd;
  __device__ __forceinline__ explicit gemma_a2(const uint8_t* p) {
    const size_t at = reinterpret_cast<size_t>(p);
    words = reinterpret_cast<const unsigned int*>(at & ~static_cast<size_t>(3));
    odd = static_cast<int>((at >> 1) & 1);
    next = words + odd;
  }
  __device__ __forceinline__ unsigned int word(int i) const {
    return __funnelshift_r(__ldg(words + i), __ldg(next + i), 16 * odd);
  }
  __device__ __forceinline__ unsigned short half(int i) const {
    return static_cast<unsigned short>(__ldg(words + i) >> (16 * odd));
  }
};

// The activations of lane t for group `group` of 32 (its positions 8t … 8t + 7,
// both steps' operands) and the group's sum.
__device__ __forceinline__ uint4 gemma_mma_x32(const unsigned short* xh, int group, int t) {
  return *reinterpret_cast<const uint4*>(xh + 32 * group + 8 * t);
}
__device__ __forceinline__ float gemma_mma_sum32(const float* xsum, int group) {
  const float2 s = *reinterpret_cast<const float2*>(xsum + 2 * group);
  return s.x + s.y;
}

// Two steps over 32 values added to the sums c: step k takes the pairs
// even[r][k] (positions p + 4k, p + 4k + 2 of row r, p = 8t for a group of
// 32) and odd[r][k] (p + 4k + 1, p + 4k + 3), against lane t's activations
// x of positions p … p + 7.
__device__ __forceinline__ void gemma_mma_steps32(const unsigned int (&even)[2][2], const unsigned int (&odd)[2][2],
                                                  const uint4& x, float (&c)[4]) {
  #pragma unroll
  for (int k = 0; k < 2; ++k) {
    const unsigned int a[4] = {even[0][k], even[1][k], odd[0][k], odd[1][k]};
    const unsigned int b[2] = {k ? x.z : x.x, k ? x.w : x.y};
    gemma_mma_f16(c, a, b);
  }
}

// gemma_mma_steps32 over a group of 32 into a fresh sum c.
__device__ __forceinline__ void gemma_mma_group32(const unsigned int (&even)[2][2], const unsigned int (&odd)[2][2],
                                                  const uint4& x, float (&c)[4]) {
  c[0] = c[1] = c[2] = c[3] = 0.0f;
  gemma_mma_steps32(even, odd, x, c);
}

// acc[r] += scale[r]·(row r's sum) + shift[r]·X, rows g (c[0]) and g + 8 (c[2]).
__device__ __forceinline__ void gemma_mma_add(float (&acc)[2], const float (&c)[4], float s0, float s1, float b0,
                                              float b1, float X) {
  acc[0] = fmaf(s0, c[0], fmaf(b0, X, acc[0]));
  acc[1] = fmaf(s1, c[2], fmaf(b1, X, acc[1]));
}

// A lane's two rows of a tile (g and g + 8) as its reader loads them: their
// first bytes and, for MLX affine rows, their first scales and biases.
template <typename S> struct gemma_mma_rows {
  const uint8_t* data[2];
  const S* scales[2];
  const S* biases[2];
};

// Q4_0, Q5_0 and Q8_0: a unit is one block of 32 values. Lane t's 8 codes:
// Q8_0 bytes 8t …; Q4_0/Q5_0 the low (t < 2) or high nibbles of bytes
// 8·(t % 2) …, Q5_0 with fifth bits 8t … of its 32.
template <int WF> struct gemma_mb32 {
  static constexpr int VALUES = 32;
  static constexpr int STEPS = 8;
  static constexpr int BYTES = gemma_wblock<WF>::BYTES;
  uint2 q[2];
  unsigned int high[2];
  unsigned short d[2];
  template <typename S>
  __device__ __forceinline__ void load(const gemma_mma_rows<S>& rows, int u, int t) {
    // Lane t's 8 codes start at byte 2 (Q5_0: 6) of the block plus 8t
    // (Q8_0) or 8·(t % 2); blocks are aligned to 2 only, so 2-byte loads.
    constexpr int AT = WF == 2 ? 6 : 2;
    const int at = (AT + (WF == 3 ? 8 * t : 8 * (t & 1))) / 2;
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      const unsigned short* b = reinterpret_cast<const unsigned short*>(rows.data[r] + u * BYTES);
      d[r] = __ldg(b);
      const unsigned short* c = b + at;
      q[r] = make_uint2(__byte_perm(__ldg(c), __ldg(c + 1), 0x5410), __byte_perm(__ldg(c + 2), __ldg(c + 3), 0x5410));
      if constexpr (WF == 2) high[r] = __byte_perm(__ldg(b + 1), __ldg(b + 2), 0x5410);
    }
  }
  __device__ __forceinline__ void dot(const unsigned short* xh, const float* xsum, int u, int t,
                                      float (&acc)[2]) const {
    const uint4 x = gemma_mma_x32(xh, u, t);
    const float X = gemma_mma_sum32(xsum, u);
    unsigned int w[2][2];
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (WF == 3) {
        w[r][0] = q[r].x ^ 0x80808080u;
        w[r][1] = q[r].y ^ 0x80808080u;
      } else {
        const int shift = 4 * (t >> 1);
        w[r][0] = (q[r].x >> shift) & 0x0F0F0F0Fu;
        w[r][1] = (q[r].y >> shift) & 0x0F0F0F0Fu;
        if constexpr (WF == 2) {
          const unsigned int fifth = high[r] >> (8 * t);
          w[r][0] |= gemma_spread4(fifth, 0) << 4;
          w[r][1] |= gemma_spread4(fifth, 4) << 4;
        }
      }
    }
    unsigned int even[2][2], odd[2][2];
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      #pragma unroll
      for (int k = 0; k < 2; ++k) {
        even[r][k] = gemma_h_even(w[r][k]);
        odd[r][k] = gemma_h_odd(w[r][k]);
      }
    }
    float c[4];
    gemma_mma_group32(even, odd, x, c);
    // Values 1024 + q + Z enter for q − Z·… : Q8_0 q + 128 (so 1152), Q5_0
    // q with zero 16 (1040), Q4_0 zero 8 (1032).
    constexpr float OFFSET = WF == 3 ? -1152.0f : (WF == 2 ? -1040.0f : -1032.0f);
    const float d0 = gemma_f16_bits(d[0]), d1 = gemma_f16_bits(d[1]);
    gemma_mma_add(acc, c, d0, d1, OFFSET * d0, OFFSET * d1, X);
  }
};

// Q4_K and Q5_K: a unit is one block of 256 values. Lane t takes bytes 8t …
// 8t + 7 of each 32 bytes of nibbles (positions 8t … of sub-blocks 2j, low
// nibbles, and 2j + 1, high nibbles) and for Q5_K the same 8 bytes of fifth
// bits.
template <int WF> struct gemma_mbk {
  static constexpr int VALUES = 256;
  static constexpr int STEPS = 2;
  static constexpr int BYTES = gemma_wblock<WF>::BYTES;
  uint4 head[2];
  uint2 qs[2][4];
  uint2 qh[2];
  template <typename S>
  __device__ __forceinline__ void load(const gemma_mma_rows<S>& rows, int u, int t) {
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint8_t* b = rows.data[r] + u * BYTES;
      head[r] = __ldg(reinterpret_cast<const uint4*>(b));
      #pragma unroll
      for (int j = 0; j < 4; ++j) qs[r][j] = __ldg(reinterpret_cast<const uint2*>(b + (WF == 4 ? 16 : 48) + 32 * j + 8 * t));
      if constexpr (WF == 5) qh[r] = __ldg(reinterpret_cast<const uint2*>(b + 16 + 8 * t));
    }
  }
  __device__ __forceinline__ void dot(const unsigned short* xh, const float* xsum, int u, int t,
                                      float (&acc)[2]) const {
    float d[2], dmin[2];
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      d[r] = gemma_f16_bits(static_cast<unsigned short>(head[r].x & 0xffff));
      dmin[r] = gemma_f16_bits(static_cast<unsigned short>(head[r].x >> 16));
    }
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      // Scales and minimums of sub-blocks 2j (byte 0) and 2j + 1 (byte 1)
      // of each row, as ggml's get_scale_min_k4.
      float scale[2][2], shift[2][2];
      #pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int s = 16 * (j & 1);
        const unsigned int a = head[r].y >> s, b = head[r].z >> s, e = head[r].w >> s;
        const unsigned int sc = j >= 2 ? (e & 0x0F0Fu) | ((a >> 2) & 0x3030u) : a & 0x3F3Fu;
        const unsigned int mn = j >= 2 ? ((e >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u) : b & 0x3F3Fu;
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float scaled = __fmul_rn(d[r], gemma_int_float(static_cast<int>((sc >> (8 * h)) & 255u)));
          const float minimum = __fmul_rn(dmin[r], gemma_int_float(static_cast<int>((mn >> (8 * h)) & 255u)));
          // Low nibbles enter as 1024 + q, high ones as 1024 + 16·q.
          scale[r][h] = h ? 0.0625f * scaled : scaled;
          shift[r][h] = -minimum - (h ? 64.0f : 1024.0f) * scaled;
        }
      }
      #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int group = 8 * u + 2 * j + h;
        unsigned int even[2][2], odd[2][2];
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
          #pragma unroll
          for (int k = 0; k < 2; ++k) {
            const unsigned int v = k ? qs[r][j].y : qs[r][j].x;
            even[r][k] = h ? gemma_h_high(v) : gemma_h_low(v);
            odd[r][k] = h ? gemma_h_high(v >> 8) : gemma_h_low(v >> 8);
            if constexpr (WF == 5) {
              // The fifth bit of sub-block 2j + h: bit 4 of a low nibble's
              // half, bit 8 of a high one's (which enters as 16·q).
              const unsigned int f = (k ? qh[r].y : qh[r].x) >> (2 * j + h);
              even[r][k] |= (f & 0x00010001u) << (h ? 8 : 4);
              odd[r][k] |= ((f >> 8) & 0x00010001u) << (h ? 8 : 4);
            }
          }
        }
        float c[4];
        gemma_mma_group32(even, odd, gemma_mma_x32(xh, group, t), c);
        gemma_mma_add(acc, c, scale[0][h], scale[1][h], shift[0][h], shift[1][h], gemma_mma_sum32(xsum, group));
      }
    }
  }
};

// Q6_K: a unit is one block of 256 values; a step one scale's 16 values:
// half p, group t4 (low nibbles of the half's first or second 32 bytes,
// then their high nibbles; two high bits each from bits 2·t4 of the half's
// 32 bytes of high bits), positions 16s … 16s + 15, of which lane t takes
// 16s + 4t … 16s + 4t + 3 (its activations 4 float16 values).
struct gemma_mb6 {
  static constexpr int VALUES = 256;
  static constexpr int STEPS = 1;
  static constexpr int BYTES = 210;
  unsigned int ql[2][2][2][2];
  unsigned int qh[2][2][2];
  unsigned int sc[2][4];
  unsigned short d[2];
  template <typename S>
  __device__ __forceinline__ void load(const gemma_mma_rows<S>& rows, int u, int t) {
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      const gemma_a2 b(rows.data[r] + u * BYTES);
      #pragma unroll
      for (int p = 0; p < 2; ++p) {
        #pragma unroll
        for (int s = 0; s < 2; ++s) {
          ql[r][p][0][s] = b.word(16 * p + 4 * s + t);
          ql[r][p][1][s] = b.word(16 * p + 8 + 4 * s + t);
          qh[r][p][s] = b.word(32 + 8 * p + 4 * s + t);
        }
      }
      #pragma unroll
      for (int k = 0; k < 4; ++k) sc[r][k] = b.word(48 + k);
      d[r] = b.half(52);
    }
  }
  __device__ __forceinline__ void dot(const unsigned short* xh, const float* xsum, int u, int t,
                                      float (&acc)[2]) const {
    const float dd[2] = {gemma_f16_bits(d[0]), gemma_f16_bits(d[1])};
    #pragma unroll
    for (int p = 0; p < 2; ++p) {
      #pragma unroll
      for (int t4 = 0; t4 < 4; ++t4) {
        #pragma unroll
        for (int s = 0; s < 2; ++s) {
          unsigned int a[4];
          #pragma unroll
          for (int r = 0; r < 2; ++r) {
            const unsigned int low = ql[r][p][t4 & 1][s] >> (4 * (t4 >> 1));
            const unsigned int high = qh[r][p][s] >> (2 * t4);
            a[r] = (low & 0x000F000Fu) | ((high & 0x00030003u) << 4) | 0x64006400u;
            a[2 + r] = ((low >> 8) & 0x000F000Fu) | (((high >> 8) & 0x00030003u) << 4) | 0x64006400u;
          }
          const int at = 256 * u + 128 * p + 32 * t4 + 16 * s;
          const uint2 x = *reinterpret_cast<const uint2*>(xh + at + 4 * t);
          const unsigned int b[2] = {x.x, x.y};
          float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          gemma_mma_f16(c, a, b);
          // Values 1024 + q enter for q − 32.
          const float X = xsum[at / 16];
          const int k = 8 * p + 2 * t4 + s;
          #pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int scale = static_cast<int>(static_cast<signed char>((sc[r][k >> 2] >> (8 * (k & 3))) & 255u));
            acc[r] = fmaf(__fmul_rn(dd[r], gemma_int_float(scale)), fmaf(-1056.0f, X, c[2 * r]), acc[r]);
          }
        }
      }
    }
  }
};

// MLX affine rows (format 7): a unit is one group of WG values of a row,
// with its scale s and bias b (of S); WB-bit codes packed least significant
// bit first in 32-bit words, value s·q + b. Lane t takes the group's values
// (WG/4)·t … (WG/4)·(t + 1) − 1, its WORDS words of each row in one load of
// 4, 8 or 16 bytes (two of 16 for 32 bytes; a row is K·WB/32 words, K a
// multiple of WG, so every lane's words are aligned to their size). Each 8
// of its values (a word of 4-bit codes, nibble i value i; two words of
// bytes) make two steps, all of a group's steps summing into one c, to
// which the scale applies once: Σ w·x = s·Σ (1024 + q)·x + (b − 1024·s)·Σ x.
template <int WB, int WG, typename S> struct gemma_ma {
  static_assert((WB == 4 || WB == 8) && (WG == 32 || WG == 64 || WG == 128),
                "affine rows of 4 or 8 bits in groups of 32, 64 or 128");
  static constexpr int VALUES = WG;
  static constexpr int BYTES = WG * WB / 8;
  static constexpr int WORDS = WG * WB / 128;
  // About 40 registers of loads in flight (2 rows of WORDS words, a scale
  // and a bias a unit): 6, 5, 3 or 2 units, the most that the 12B and 27B
  // layer kernels hold without spilling (sm_90, 128 registers).
  static constexpr int STEPS = 20 / (WORDS + 2);
  unsigned int q[2][WORDS];
  S scale[2];
  S bias[2];
  __device__ __forceinline__ void load(const gemma_mma_rows<S>& rows, int u, int t) {
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      const unsigned int* w = reinterpret_cast<const unsigned int*>(rows.data[r] + u * BYTES) + WORDS * t;
      if constexpr (WORDS == 1) {
        q[r][0] = __ldg(w);
      } else if constexpr (WORDS == 2) {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(w));
        q[r][0] = v.x;
        q[r][1] = v.y;
      } else {
        #pragma unroll
        for (int i = 0; i < WORDS / 4; ++i) {
          const uint4 v = __ldg(reinterpret_cast<const uint4*>(w) + i);
          q[r][4 * i] = v.x;
          q[r][4 * i + 1] = v.y;
          q[r][4 * i + 2] = v.z;
          q[r][4 * i + 3] = v.w;
        }
      }
      scale[r] = __ldg(rows.scales[r] + u);
      bias[r] = __ldg(rows.biases[r] + u);
    }
  }
  __device__ __forceinline__ void dot(const unsigned short* xh, const float* xsum, int u, int t,
                                      float (&acc)[2]) const {
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    #pragma unroll
    for (int j = 0; j < WG / 32; ++j) {
      const uint4 x = *reinterpret_cast<const uint4*>(xh + WG * u + (WG / 4) * t + 8 * j);
      unsigned int even[2][2], odd[2][2];
      #pragma unroll
      for (int r = 0; r < 2; ++r) {
        if constexpr (WB == 4) {
          // `low` holds the word's values 0, 2, 4, 6 a byte each, `high`
          // values 1, 3, 5, 7; two bytes spread to float16 halves 1024 + q.
          const unsigned int low = q[r][j] & 0x0F0F0F0Fu, high = (q[r][j] >> 4) & 0x0F0F0F0Fu;
          even[r][0] = __byte_perm(low, 0x64646464u, 0x4140);
          odd[r][0] = __byte_perm(high, 0x64646464u, 0x4140);
          even[r][1] = __byte_perm(low, 0x64646464u, 0x4342);
          odd[r][1] = __byte_perm(high, 0x64646464u, 0x4342);
        } else {
          #pragma unroll
          for (int k = 0; k < 2; ++k) {
            even[r][k] = gemma_h_even(q[r][2 * j + k]);
            odd[r][k] = gemma_h_odd(q[r][2 * j + k]);
          }
        }
      }
      gemma_mma_steps32(even, odd, x, c);
    }
    float X;
    if constexpr (WG == 32) {
      X = gemma_mma_sum32(xsum, u);
    } else {
      const float4* s = reinterpret_cast<const float4*>(xsum + (WG / 16) * u);
      const float4 a = s[0];
      X = (a.x + a.y) + (a.z + a.w);
      if constexpr (WG == 128) {
        const float4 b = s[1];
        X += (b.x + b.y) + (b.z + b.w);
      }
    }
    const float s0 = static_cast<float>(scale[0]), s1 = static_cast<float>(scale[1]);
    gemma_mma_add(acc, c, s0, s1, fmaf(-1024.0f, s0, static_cast<float>(bias[0])),
                  fmaf(-1024.0f, s1, static_cast<float>(bias[1])), X);
  }
};

template <int WF, int WB, int WG, typename S> struct gemma_mma_reader;
template <int WB, int WG, typename S> struct gemma_mma_reader<1, WB, WG, S> { using type = gemma_mb32<1>; };
template <int WB, int WG, typename S> struct gemma_mma_reader<2, WB, WG, S> { using type = gemma_mb32<2>; };
template <int WB, int WG, typename S> struct gemma_mma_reader<3, WB, WG, S> { using type = gemma_mb32<3>; };
template <int WB, int WG, typename S> struct gemma_mma_reader<4, WB, WG, S> { using type = gemma_mbk<4>; };
template <int WB, int WG, typename S> struct gemma_mma_reader<5, WB, WG, S> { using type = gemma_mbk<5>; };
template <int WB, int WG, typename S> struct gemma_mma_reader<6, WB, WG, S> { using type = gemma_mb6; };
template <int WB, int WG, typename S> struct gemma_mma_reader<7, WB, WG, S> { using type = gemma_ma<WB, WG, S>; };

// Rows row0 … row0 + 15 (format WF, K values each; for MLX affine rows WB
// bits and groups of WG with their `scales` and `biases`, unused by the
// other formats) dotted with the activations `xh` (gemma_mma_put4's
// float16 values, with the sums of each 16 in `xsum`) over the units
// (blocks or groups) of slice `slice` of `slices`, added to acc[0] (row
// row0 + g) and acc[1] (row row0 + g + 8): every lane of group g holds the
// same two sums. The loads of STEPS units are in flight before any is used.
// All 32 lanes must take part.
template <int WF, int WB, int WG, typename S>
__device__ __forceinline__ void gemma_mma_tile(const void* data, const S* scales, const S* biases, size_t row0,
                                               int K, int slice, int slices, const unsigned short* xh,
                                               const float* xsum, int lane, float (&acc)[2]) {
  using R = typename gemma_mma_reader<WF, WB, WG, S>::type;
  const int g = lane >> 2, t = lane & 3;
  const int units = K / R::VALUES;
  const size_t row_bytes = static_cast<size_t>(units) * R::BYTES;
  const uint8_t* first = reinterpret_cast<const uint8_t*>(data) + (row0 + g) * row_bytes;
  // Affine rows have one scale and one bias a unit.
  const size_t at = WF == 7 ? (row0 + g) * static_cast<size_t>(units) : 0, next = WF == 7 ? 8 * units : 0;
  const gemma_mma_rows<S> rows{
      {first, first + 8 * row_bytes}, {scales + at, scales + at + next}, {biases + at, biases + at + next}};
  // A warp's STEPS units at a time: every slices-th unit, or for affine
  // rows (small units) STEPS consecutive ones, whose addresses then differ
  // by constants (one address computation a round, not one a unit).
  constexpr bool RUNS = WF == 7;
  const int apart = RUNS ? 1 : slices;
  for (int u0 = RUNS ? slice * R::STEPS : slice; u0 < units; u0 += slices * R::STEPS) {
    R w[R::STEPS];
    #pragma unroll
    for (int s = 0; s < R::STEPS; ++s) {
      if (u0 + s * apart < units) w[s].load(rows, u0 + s * apart, t);
    }
    #pragma unroll
    for (int s = 0; s < R::STEPS; ++s) {
      if (u0 + s * apart < units) w[s].dot(xh, xsum, u0 + s * apart, t, acc);
    }
  }
}
"#;

/// The formats (by their names in [`FORMAT_NAMES`]) whose projections run
/// on the tensor cores unless `GEMMA_MLX_TENSOR_CORES` says otherwise, in
/// models of at least [`MIN_HIDDEN_FOR_TENSOR_CORES`] values a token. MLX
/// affine rows (`affine`) are not among them: their reader is checked on
/// the host and compiled for sm_90, but no GPU has timed it against the
/// scalar reader yet.
const DEFAULT_FORMATS: &[&str] = &["q4_k", "q5_k", "q6_k"];

/// The hidden size from which the tensor cores take [`DEFAULT_FORMATS`] by
/// default. On an H100 (2026-12-07, Q4_K_M files, decode after 2048
/// tokens) the K-quants on the tensor cores decoded 1B (hidden 1152) at
/// 402–411 tok/s against 432–434 with the scalar readers, and 4B (2560)
/// at 246–248 against 218–219, 12B (3840) at 123–124 against 103–104:
/// small matrices leave too few 16-row tiles per block to pay for them.
const MIN_HIDDEN_FOR_TENSOR_CORES: i32 = 2048;

/// The formats whose projections run on the tensor cores in a model of
/// `hidden` values a token, as a mask of format numbers (bit `f` for format
/// `f`): those `GEMMA_MLX_TENSOR_CORES` names (comma-separated names of
/// [`FORMAT_NAMES`] such as `q4_k,q6_k,affine`; `none` for the scalar
/// readers of `weight_rows` only), else [`DEFAULT_FORMATS`] from
/// [`MIN_HIDDEN_FOR_TENSOR_CORES`] and none below. Unknown names are
/// ignored.
pub(super) fn tensor_core_formats(hidden: i32) -> i32 {
    static CHOSEN: OnceLock<Option<String>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| std::env::var("GEMMA_MLX_TENSOR_CORES").ok());
    formats_mask(chosen.as_deref(), hidden)
}

/// Whether rows of format `format` are read on the tensor cores in a model
/// of `hidden` values a token (the host's side of the kernels'
/// `gemma_mma_on`).
pub(super) fn reads_on_tensor_cores(format: i32, hidden: i32) -> bool {
    (1..=FORMAT_NAMES.len() as i32).contains(&format)
        && tensor_core_formats(hidden) & (1 << format) != 0
}

/// The mask of [`tensor_core_formats`] for a `GEMMA_MLX_TENSOR_CORES` value
/// and a hidden size.
fn formats_mask(chosen: Option<&str>, hidden: i32) -> i32 {
    let names: Vec<String> = match chosen {
        Some(list) => list
            .split(',')
            .map(|n| n.trim().to_ascii_lowercase())
            .collect(),
        None if hidden >= MIN_HIDDEN_FOR_TENSOR_CORES => {
            DEFAULT_FORMATS.iter().map(|n| n.to_string()).collect()
        }
        None => Vec::new(),
    };
    names
        .iter()
        .filter_map(|name| FORMAT_NAMES.iter().position(|n| n == name))
        .fold(0, |mask, i| mask | 1 << (i + 1))
}

/// The names of formats 1 to 7 in `GEMMA_MLX_TENSOR_CORES`: ggml's block
/// types, then MLX affine rows.
const FORMAT_NAMES: [&str; 7] = ["q4_0", "q5_0", "q8_0", "q4_k", "q5_k", "q6_k", "affine"];

/// The tensor-core device functions, for tools and tests that compile them (after
/// `weight_rows`' header, which they use).
pub fn tensor_core_source() -> &'static str {
    HEADER
}

#[cfg(test)]
mod tests {
    use super::formats_mask;

    #[test]
    fn the_tensor_cores_take_the_k_quants_of_large_models_unless_told_otherwise() {
        // Bits 4, 5, 6: Q4_K, Q5_K, Q6_K, from a hidden size of 2048 (4B's
        // 2560, not 1B's 1152).
        assert_eq!(formats_mask(None, 2560), 0b111_0000);
        assert_eq!(formats_mask(None, 2048), 0b111_0000);
        assert_eq!(formats_mask(None, 1152), 0);
        assert_eq!(formats_mask(Some("none"), 3840), 0);
        // Named types whatever the size: Q4_0 (1) and Q8_0 (3), any case
        // and spacing; unknown names ignored.
        assert_eq!(formats_mask(Some(" Q4_0,q8_0 , iq2_xs"), 640), 0b1010);
        assert_eq!(
            formats_mask(Some("q4_0,q5_0,q8_0,q4_k,q5_k,q6_k"), 1152),
            0b111_1110
        );
    }

    #[test]
    fn mlx_affine_rows_take_the_tensor_cores_only_when_named() {
        // Bit 7: off by default at every size, on where named, beside the
        // K-quants or alone.
        assert_eq!(formats_mask(None, 3840) & 1 << 7, 0);
        assert_eq!(formats_mask(None, 1152) & 1 << 7, 0);
        assert_eq!(formats_mask(Some("affine"), 1152), 1 << 7);
        assert_eq!(
            formats_mask(Some("q4_k,q5_k,q6_k, Affine"), 3840),
            0b1111_0000
        );
    }
}
