// Products of ggml block-quantized rows, and of MLX's affine-quantized
// rows, with activations quantized to 8 bits per 16 values, on the CPU (one
// row of activations while decoding, several for short prompts): AVX2
// kernels that unpack each block in registers (the 5- and 6-bit formats'
// high bits are spread to bytes with shuffles and masks) and sum the
// products as integers with `maddubs`/`madd`. Each 32 values' 8
// integer lanes (4 per group of 16) are scaled by the weights' and the
// activations' scales of their group and accumulated in float32. The value
// of each stored integer is ggml's (or MLX's):
// crates/gemma/src/weights/gguf/blocks.rs describes the same GGUF formats
// and its Rust kernels, the portable fallback, compute the same sums.
//
// The kernels come in families (`mlx_cpu_kernels`), chosen by the caller
// for each call: `AVX2` runs the 256-bit kernels only, `AVX512` the 512-bit
// VNNI ones where a format has one (the 256-bit ones elsewhere), `PORTABLE`
// none of them (the caller's Rust kernels then run). A family the CPU lacks
// is refused, never run. The integer sums are exact in every family; only
// the order of the float additions differs between them.

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "internal.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics start from `_mm512_undefined_*` values, which
// its own -Wmaybe-uninitialized then reports at every use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

using namespace mlxc;

namespace {

/// ggml's type ids of the formats with a kernel here.
enum : uint32_t {
  kQ4_0 = 2,
  kQ5_0 = 6,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
};

/// A format's block: values and bytes.
struct BlockShape {
  size_t values;
  size_t bytes;
};

/// The block of a format with a kernel here, or {0, 0}.
BlockShape block_shape(uint32_t type) {
  switch (type) {
    case kQ4_0:
      return {32, 18};
    case kQ5_0:
      return {32, 22};
    case kQ8_0:
      return {32, 34};
    case kQ4_K:
      return {256, 144};
    case kQ5_K:
      return {256, 176};
    case kQ6_K:
      return {256, 210};
    default:
      return {0, 0};
  }
}

#if defined(__x86_64__)

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/// Whether this CPU runs the kernels here (asked once).
bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }();
  return has;
}

/// The little-endian f16 at `p`, widened.
AVX2 inline float f16_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return _cvtsh_ss(bits);
}

AVX2 inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

/// Bytes ahead of the block being multiplied that the single-row kernels
/// ask the cache for: a row's product streams the matrix from memory, and
/// the hardware prefetchers alone kept two cores of an AVX-512 Xeon at 16.5
/// of the 25 GB/s they read (the logits' Q8_0 product: 10.8 → 7.7 ms).
constexpr size_t kPrefetchBytes = 2048;

/// Asks for the cache lines of the `bytes` bytes `kPrefetchBytes` past `p`
/// (a prefetch never faults, past the matrix's end included).
AVX2 inline void prefetch_ahead(const uint8_t* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + o),
                 _MM_HINT_T0);
  }
}

/// Lanes 0–3 `lo`, lanes 4–7 `hi`: the scales of a 32-value vector's two
/// groups, laid out as `dot32` lays out their sums.
AVX2 inline __m256 halves(float lo, float hi) {
  return _mm256_set_m128(_mm_set1_ps(hi), _mm_set1_ps(lo));
}

/// Σ w·x over 32 signed bytes, as 8 int32 lanes: lanes 0–3 sum bytes
/// 0–15, lanes 4–7 bytes 16–31. `x` must lie in [−127, 127].
AVX2 inline __m256i signed_dot(__m256i w, __m256i x) {
  const __m256i p =
      _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/// As `signed_dot`, for weights in [0, 63].
AVX2 inline __m256i unsigned_dot(__m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

/// acc + lanes · scales.
AVX2 inline __m256 scaled_add(__m256 acc, __m256i lanes, __m256 scales) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scales, acc);
}

/// Byte i of the result is 0xFF where bit i of `bits` is set, else 0.
AVX2 inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                         0x0303030303030303));
  const __m256i mask = _mm256_set1_epi64x(0x8040201008040201);
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
}

/// 16 bytes of nibbles as 32 bytes: the low nibbles, then the high ones.
AVX2 inline __m256i nibbles16(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b),
                          _mm256_set1_epi8(0x0F));
}

AVX2 inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// The activations of one product.
struct Activations {
  const int8_t* q;
  const float* scales;
  const float* sums;
};

/// One row of blocks of 32 values with one f16 scale first:
/// `Format::values(block)` gives a block's 32 signed integers.
template <typename Format>
AVX2 inline float row_of_32(const uint8_t* row, size_t blocks,
                            const Activations& x) {
  __m256 acc = _mm256_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * Format::kBytes;
    if (b % 2 == 0) {
      prefetch_ahead(block, 1);
    }
    const __m256 scales =
        _mm256_mul_ps(_mm256_set1_ps(f16_at(block)),
                      halves(x.scales[2 * b], x.scales[2 * b + 1]));
    acc = scaled_add(
        acc, signed_dot(Format::values(block), load32(x.q + 32 * b)), scales);
  }
  return sum8(acc);
}

/// Q8_0: f16 d, 32 int8; value = d · q.
struct Q8_0 {
  static constexpr size_t kBytes = 34;
  AVX2 static __m256i values(const uint8_t* b) { return load32(b + 2); }
};

/// Q4_0: f16 d, 16 bytes of nibbles (low: values 0–15, high: 16–31);
/// value = d · (q − 8).
struct Q4_0 {
  static constexpr size_t kBytes = 18;
  AVX2 static __m256i values(const uint8_t* b) {
    return _mm256_sub_epi8(nibbles16(b + 2), _mm256_set1_epi8(8));
  }
};

/// Q5_0: f16 d, 32 fifth bits, nibbles as Q4_0; value = d · (q − 16).
struct Q5_0 {
  static constexpr size_t kBytes = 22;
  /// The 32 stored integers q, in [0, 31].
  AVX2 static __m256i stored(const uint8_t* b) {
    uint32_t high;
    std::memcpy(&high, b + 2, sizeof high);
    const __m256i fifth =
        _mm256_and_si256(bits_to_bytes(high), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles16(b + 6), fifth);
  }
  AVX2 static __m256i values(const uint8_t* b) {
    return _mm256_sub_epi8(stored(b), _mm256_set1_epi8(16));
  }
};

AVX2 float row_q8_0(const uint8_t* row, size_t blocks, const Activations& x) {
  return row_of_32<Q8_0>(row, blocks, x);
}

AVX2 float row_q4_0(const uint8_t* row, size_t blocks, const Activations& x) {
  return row_of_32<Q4_0>(row, blocks, x);
}

AVX2 float row_q5_0(const uint8_t* row, size_t blocks, const Activations& x) {
  return row_of_32<Q5_0>(row, blocks, x);
}

/// The 6-bit scales and minimums of a Q4_K or Q5_K block's 8 sub-blocks.
inline void k_scales(const uint8_t* q, uint8_t sc[8], uint8_t m[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = q[j] & 63;
    m[j] = q[j + 4] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    sc[j] = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/// A Q4_K or Q5_K block's scales: d, dmin, and its 8 sub-blocks' 6-bit
/// scales and minimums.
struct KBlockScales {
  float d;
  float dmin;
  uint8_t sc[8];
  uint8_t m[8];

  AVX2 explicit KBlockScales(const uint8_t* block)
      : d(f16_at(block)), dmin(f16_at(block + 2)) {
    k_scales(block + 4, sc, m);
  }
};

/// Sub-blocks 2p (`lo`) and 2p + 1 (`hi`) of a Q4_K (`fifth` false) or
/// Q5_K block: their 32 stored integers each, in [0, 15] or [0, 31].
template <bool fifth>
AVX2 inline void k_4_5_values(const uint8_t* block, int p, __m256i& lo,
                              __m256i& hi) {
  constexpr size_t kQs = fifth ? 48 : 16;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i q = load32(block + kQs + 32 * p);
  lo = _mm256_and_si256(q, low4);
  hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
  if (fifth) {
    const __m256i high = load32(block + 16);
    const __m256i one = _mm256_set1_epi8(1);
    lo = _mm256_or_si256(
        lo, _mm256_slli_epi16(
                _mm256_and_si256(_mm256_srli_epi16(high, 2 * p), one), 4));
    hi = _mm256_or_si256(
        hi, _mm256_slli_epi16(
                _mm256_and_si256(_mm256_srli_epi16(high, 2 * p + 1), one), 4));
  }
}

/// One row of Q4_K (`fifth` false) or Q5_K blocks: value = d · sc · q −
/// dmin · m per sub-block of 32, q in [0, 15] or [0, 31].
template <bool fifth>
AVX2 inline float row_k_4_5(const uint8_t* row, size_t blocks,
                            const Activations& x) {
  constexpr size_t kBytes = fifth ? 176 : 144;
  __m256 acc = _mm256_setzero_ps();
  float offsets = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * kBytes;
    prefetch_ahead(block, kBytes);
    const KBlockScales k(block);
    for (int p = 0; p < 4; ++p) {
      __m256i lo, hi;
      k_4_5_values<fifth>(block, p, lo, hi);
      const size_t g = 16 * b + 4 * p;  // the activations' group of `lo`
      const float d_lo = k.d * k.sc[2 * p];
      const float d_hi = k.d * k.sc[2 * p + 1];
      acc = scaled_add(acc, unsigned_dot(lo, load32(x.q + 16 * g)),
                       _mm256_mul_ps(_mm256_set1_ps(d_lo),
                                     halves(x.scales[g], x.scales[g + 1])));
      acc = scaled_add(acc, unsigned_dot(hi, load32(x.q + 16 * (g + 2))),
                       _mm256_mul_ps(_mm256_set1_ps(d_hi),
                                     halves(x.scales[g + 2], x.scales[g + 3])));
      offsets -= k.dmin * (k.m[2 * p] * (x.sums[g] + x.sums[g + 1]) +
                           k.m[2 * p + 1] * (x.sums[g + 2] + x.sums[g + 3]));
    }
  }
  return sum8(acc) + offsets;
}

AVX2 float row_q4_k(const uint8_t* row, size_t blocks, const Activations& x) {
  return row_k_4_5<false>(row, blocks, x);
}

AVX2 float row_q5_k(const uint8_t* row, size_t blocks, const Activations& x) {
  return row_k_4_5<true>(row, blocks, x);
}

/// One row of Q6_K blocks: value = d · sc · (q − 32), q in [0, 63] from a
/// nibble of `ql` and two bits of `qh`, an int8 scale per 16 values. The
/// products take q as stored; the 32 is taken off through the groups' sums.
/// Values 128n to 128n + 127 of a Q6_K block as their stored integers
/// (in [0, 63]), 32 per vector.
AVX2 inline void q6_k_values(const uint8_t* block, int n, __m256i q[4]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i low2 = _mm256_set1_epi8(0x03);
  const __m256i ql0 = load32(block + 64 * n);
  const __m256i ql1 = load32(block + 64 * n + 32);
  const __m256i qh = load32(block + 128 + 32 * n);
  q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4),
                         _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4));
  q[1] = _mm256_or_si256(
      _mm256_and_si256(ql1, low4),
      _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4));
  q[2] = _mm256_or_si256(
      _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
      _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4));
  q[3] = _mm256_or_si256(
      _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
      _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4));
}

AVX2 float row_q6_k(const uint8_t* row, size_t blocks, const Activations& x) {
  __m256 acc = _mm256_setzero_ps();
  float offsets = 0.0f;
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * 210;
    prefetch_ahead(block, 210);
    const auto* sc = reinterpret_cast<const int8_t*>(block + 192);
    const float d = f16_at(block + 208);
    for (int n = 0; n < 2; ++n) {
      __m256i q[4];
      q6_k_values(block, n, q);
      for (int k = 0; k < 4; ++k) {
        const size_t g = 16 * b + 8 * n + 2 * k;
        const float d_lo = d * sc[8 * n + 2 * k];
        const float d_hi = d * sc[8 * n + 2 * k + 1];
        acc = scaled_add(
            acc, unsigned_dot(q[k], load32(x.q + 16 * g)),
            _mm256_mul_ps(halves(d_lo, d_hi),
                          halves(x.scales[g], x.scales[g + 1])));
        offsets -= 32.0f * (d_lo * x.sums[g] + d_hi * x.sums[g + 1]);
      }
    }
  }
  return sum8(acc) + offsets;
}

/// MLX's affine rows: `bits` 4 (two values a byte, the low nibble first) or
/// 8, one f32 scale and bias per `group` values (32, 64 or 128); value =
/// scale · q + bias. 8-bit values are taken as q − 128 (signed, so that
/// `maddubs` cannot saturate), the 128 · scale going into the bias.
struct AffineRows {
  const uint8_t* w;
  size_t row_bytes;
  const float* scales;
  const float* biases;
  size_t groups;
  int bits;
  int group;
};

template <int BITS>
AVX2 inline float affine_row(const AffineRows& m, size_t r,
                             const Activations& x) {
  const uint8_t* row = m.w + r * m.row_bytes;
  const float* scales = m.scales + r * m.groups;
  const float* biases = m.biases + r * m.groups;
  const size_t per_group = static_cast<size_t>(m.group) / 32;
  __m256 acc = _mm256_setzero_ps();
  float offsets = 0.0f;
  for (size_t g = 0; g < m.groups; ++g) {
    const float scale = scales[g];
    const float bias = BITS == 8 ? biases[g] + 128.0f * scale : biases[g];
    for (size_t k = 0; k < per_group; ++k) {
      const size_t v = (g * per_group + k) * 32;  // the vector's first value
      if (v * BITS / 8 % 64 == 0) {  // each cache line once
        prefetch_ahead(row + v * BITS / 8, 1);
      }
      const __m256 scales_x =
          _mm256_mul_ps(_mm256_set1_ps(scale),
                        halves(x.scales[v / 16], x.scales[v / 16 + 1]));
      if (BITS == 4) {
        const __m128i b =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + v / 2));
        const __m128i low4 = _mm_set1_epi8(0x0F);
        const __m128i lo = _mm_and_si128(b, low4);
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
        const __m256i q = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi),
                                           _mm_unpacklo_epi8(lo, hi));
        acc = scaled_add(acc, unsigned_dot(q, load32(x.q + v)), scales_x);
      } else {
        const __m256i q = _mm256_sub_epi8(
            load32(row + v), _mm256_set1_epi8(static_cast<char>(0x80)));
        acc = scaled_add(acc, signed_dot(q, load32(x.q + v)), scales_x);
      }
      offsets += bias * (x.sums[v / 16] + x.sums[v / 16 + 1]);
    }
  }
  return sum8(acc) + offsets;
}

AVX2 void affine_rows(const AffineRows& m, size_t rows, const Activations& x,
                      float* out) {
  for (size_t r = 0; r < rows; ++r) {
    out[r] = m.bits == 4 ? affine_row<4>(m, r, x) : affine_row<8>(m, r, x);
  }
}

// ---- Several rows of activations (prefill) ----
//
// Each tile of weight rows is decoded once into integers, one scale and one
// additive term per 16 values, and then multiplied with every row of
// activations: value j of a weight row is s · q_j + m of its group, q
// unsigned (the stored integer plus the format's offset, which goes into m)
// or, for Q8_0, signed. The integer sums of 128 values (8 groups) are
// reduced to one lane per group before they are scaled, so that the float
// work is one multiply-add per group, not per 4 products: the lanes then
// hold groups 0, 2, 4, 6, 1, 3, 5, 7 (`lane_of`), and the scales are stored
// in that order.

/// Weight rows decoded for the multi-row product.
struct DecodedRows {
  size_t cols;
  std::vector<uint8_t> q;  // `cols` integers a row
  std::vector<float> s;    // each group's scale, lane order, `cols / 16` a row
  std::vector<float> m;    // each group's additive term, `cols / 16` a row

  DecodedRows(size_t rows, size_t cols)
      : cols(cols), q(rows * cols), s(rows * cols / 16), m(rows * cols / 16) {}

  uint8_t* q_row(size_t r) { return q.data() + r * cols; }
  float* s_row(size_t r) { return s.data() + r * cols / 16; }
  float* m_row(size_t r) { return m.data() + r * cols / 16; }
  const uint8_t* q_row(size_t r) const { return q.data() + r * cols; }
  const float* s_row(size_t r) const { return s.data() + r * cols / 16; }
  const float* m_row(size_t r) const { return m.data() + r * cols / 16; }
};

/// Group `g`'s place in lane order.
inline size_t lane_of(size_t g) {
  static constexpr size_t kLaneOf[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  return g / 8 * 8 + kLaneOf[g % 8];
}

/// Where the 256-bit tiles keep a group's scale: one float, in lane order.
struct LaneOrderScales {
  static void put(float* s, size_t g, float scale) { s[lane_of(g)] = scale; }
};

/// Where the 512-bit tiles keep a group's scale: in its 4 integer lanes.
struct FourLaneScales {
  static void put(float* s, size_t g, float scale) {
    std::fill(s + 4 * g, s + 4 * g + 4, scale);
  }
};

/// One decoded row's outputs, the scales laid out as `Scales` puts them.
template <typename Scales>
struct RowOutputs {
  uint8_t* q;
  float* s;
  float* m;

  /// Groups `first` to `first + count − 1` take scale `scale` and term
  /// `add`.
  void groups(size_t first, size_t count, float scale, float add) const {
    for (size_t g = first; g < first + count; ++g) {
      Scales::put(s, g, scale);
      m[g] = add;
    }
  }

  /// Values 32v to 32v + 31 are `values`.
  AVX2 void store(size_t v, __m256i values) const {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * v), values);
  }
};

/// A row decoded for the 256-bit multi-row product.
using DecodedRow = RowOutputs<LaneOrderScales>;

template <typename Out>
AVX2 void decode_q4_0(const uint8_t* row, size_t cols, const Out& out) {
  for (size_t b = 0; b < cols / 32; ++b) {
    const uint8_t* block = row + 18 * b;
    const float d = f16_at(block);
    out.store(b, nibbles16(block + 2));
    out.groups(2 * b, 2, d, -8.0f * d);
  }
}

template <typename Out>
AVX2 void decode_q5_0(const uint8_t* row, size_t cols, const Out& out) {
  for (size_t b = 0; b < cols / 32; ++b) {
    const uint8_t* block = row + 22 * b;
    const float d = f16_at(block);
    out.store(b, Q5_0::stored(block));
    out.groups(2 * b, 2, d, -16.0f * d);
  }
}

/// Q8_0's integers stay signed.
template <typename Out>
AVX2 void decode_q8_0(const uint8_t* row, size_t cols, const Out& out) {
  for (size_t b = 0; b < cols / 32; ++b) {
    const uint8_t* block = row + 34 * b;
    out.store(b, Q8_0::values(block));
    out.groups(2 * b, 2, f16_at(block), 0.0f);
  }
}

template <bool fifth, typename Out>
AVX2 void decode_k_4_5(const uint8_t* row, size_t cols, const Out& out) {
  constexpr size_t kBytes = fifth ? 176 : 144;
  for (size_t b = 0; b < cols / 256; ++b) {
    const uint8_t* block = row + b * kBytes;
    const KBlockScales k(block);
    for (int p = 0; p < 4; ++p) {
      __m256i lo, hi;
      k_4_5_values<fifth>(block, p, lo, hi);
      out.store(8 * b + 2 * p, lo);
      out.store(8 * b + 2 * p + 1, hi);
      out.groups(16 * b + 4 * p, 2, k.d * k.sc[2 * p], -k.dmin * k.m[2 * p]);
      out.groups(16 * b + 4 * p + 2, 2, k.d * k.sc[2 * p + 1],
                 -k.dmin * k.m[2 * p + 1]);
    }
  }
}

template <typename Out>
AVX2 void decode_q6_k(const uint8_t* row, size_t cols, const Out& out) {
  for (size_t b = 0; b < cols / 256; ++b) {
    const uint8_t* block = row + b * 210;
    const auto* sc = reinterpret_cast<const int8_t*>(block + 192);
    const float d = f16_at(block + 208);
    for (int n = 0; n < 2; ++n) {
      __m256i q[4];
      q6_k_values(block, n, q);
      for (int k = 0; k < 4; ++k) {
        out.store(8 * b + 4 * n + k, q[k]);
        for (int h = 0; h < 2; ++h) {
          const float s = d * sc[8 * n + 2 * k + h];
          out.groups(16 * b + 8 * n + 2 * k + h, 1, s, -32.0f * s);
        }
      }
    }
  }
}

using RowDecoder = void (*)(const uint8_t*, size_t, const DecodedRow&);

/// Activation rows for the multi-row product: the caller's integers and
/// group sums, the groups' scales in lane order.
struct ActivationRows {
  const int8_t* q;
  const float* sums;
  std::vector<float> s;
  size_t cols;

  ActivationRows(const Activations& x, size_t n, size_t cols)
      : q(x.q), sums(x.sums), s(n * cols / 16), cols(cols) {
    for (size_t g = 0; g < s.size(); ++g) {
      s[lane_of(g)] = x.scales[g];
    }
  }
};

/// The integer sums of 128 weights against 128 activations, one lane per
/// group of 16 in lane order; `kSigned` for signed weights.
template <bool kSigned>
AVX2 inline __m256i group_sums(const uint8_t* w, const int8_t* x) {
  __m256i i[4];
  for (int k = 0; k < 4; ++k) {
    const __m256i wk = load32(w + 32 * k);
    const __m256i xk = load32(x + 32 * k);
    i[k] = kSigned ? signed_dot(wk, xk) : unsigned_dot(wk, xk);
  }
  return _mm256_hadd_epi32(_mm256_hadd_epi32(i[0], i[1]),
                           _mm256_hadd_epi32(i[2], i[3]));
}

/// `out[c · stride + r]` for weight rows `r` and `r + 1` and activation rows
/// `c` and `c + 1`, the second of each only where `two_rows` and
/// `two_inputs` say (otherwise the first is multiplied twice and written
/// once).
template <bool kSigned>
AVX2 inline void tile_product(const DecodedRows& w, size_t r, bool two_rows,
                              const ActivationRows& x, size_t c,
                              bool two_inputs, float* out, size_t stride) {
  const size_t cols = w.cols;
  const size_t groups = cols / 16;
  const size_t r1 = two_rows ? r + 1 : r;
  const size_t c1 = two_inputs ? c + 1 : c;
  const uint8_t* wq0 = w.q_row(r);
  const uint8_t* wq1 = w.q_row(r1);
  const float* ws0 = w.s_row(r);
  const float* ws1 = w.s_row(r1);
  const int8_t* xq0 = x.q + c * cols;
  const int8_t* xq1 = x.q + c1 * cols;
  const float* xs0 = x.s.data() + c * groups;
  const float* xs1 = x.s.data() + c1 * groups;
  const float* m0 = w.m_row(r);
  const float* m1 = w.m_row(r1);
  const float* sums0 = x.sums + c * groups;
  const float* sums1 = x.sums + c1 * groups;
  __m256 a00 = _mm256_setzero_ps(), a01 = _mm256_setzero_ps();
  __m256 a10 = _mm256_setzero_ps(), a11 = _mm256_setzero_ps();
  for (size_t v = 0, g = 0; v < cols; v += 128, g += 8) {
    const __m256 s0 = _mm256_loadu_ps(ws0 + g);
    const __m256 s1 = _mm256_loadu_ps(ws1 + g);
    const __m256 t0 = _mm256_loadu_ps(xs0 + g);
    const __m256 t1 = _mm256_loadu_ps(xs1 + g);
    a00 = scaled_add(a00, group_sums<kSigned>(wq0 + v, xq0 + v),
                     _mm256_mul_ps(s0, t0));
    a01 = scaled_add(a01, group_sums<kSigned>(wq0 + v, xq1 + v),
                     _mm256_mul_ps(s0, t1));
    a10 = scaled_add(a10, group_sums<kSigned>(wq1 + v, xq0 + v),
                     _mm256_mul_ps(s1, t0));
    a11 = scaled_add(a11, group_sums<kSigned>(wq1 + v, xq1 + v),
                     _mm256_mul_ps(s1, t1));
    // The additive terms in natural group order: only the lanes' total
    // counts.
    const __m256 n0 = _mm256_loadu_ps(m0 + g);
    const __m256 n1 = _mm256_loadu_ps(m1 + g);
    const __m256 u0 = _mm256_loadu_ps(sums0 + g);
    const __m256 u1 = _mm256_loadu_ps(sums1 + g);
    a00 = _mm256_fmadd_ps(n0, u0, a00);
    a01 = _mm256_fmadd_ps(n0, u1, a01);
    a10 = _mm256_fmadd_ps(n1, u0, a10);
    a11 = _mm256_fmadd_ps(n1, u1, a11);
  }
  out[c * stride + r] = sum8(a00);
  if (two_rows) {
    out[c * stride + r1] = sum8(a10);
  }
  if (two_inputs) {
    out[c1 * stride + r] = sum8(a01);
    if (two_rows) {
      out[c1 * stride + r1] = sum8(a11);
    }
  }
}

/// `out[c · rows + r]` = row r of `w` (`rows` rows of `row_bytes` bytes)
/// against each of the `n` rows of `x`: tiles of weight rows decoded by
/// `decode`, each multiplied with every activation row.
template <bool kSigned>
AVX2 void rows_times_rows(RowDecoder decode, const uint8_t* w, size_t rows,
                          size_t row_bytes, size_t cols, size_t n,
                          const Activations& x, float* out) {
  constexpr size_t kTileRows = 4;
  const ActivationRows acts(x, n, cols);
  DecodedRows tile(kTileRows, cols);
  for (size_t r0 = 0; r0 < rows; r0 += kTileRows) {
    const size_t tile_rows = std::min(kTileRows, rows - r0);
    for (size_t i = 0; i < tile_rows; ++i) {
      decode(w + (r0 + i) * row_bytes, cols,
             DecodedRow{tile.q_row(i), tile.s_row(i), tile.m_row(i)});
    }
    for (size_t c = 0; c < n; c += 2) {
      for (size_t i = 0; i < tile_rows; i += 2) {
        tile_product<kSigned>(tile, i, i + 1 < tile_rows, acts, c, c + 1 < n,
                              out + r0, rows);
      }
    }
  }
}

/// Activation rows from which the multi-row product decodes tiles of
/// weights (fewer go row by row through the single-row kernels).
constexpr size_t kMinRowsForTiles = 4;

/// The multi-row product for `type`, or false where there is none (or
/// where `cols` is not whole 128-value steps).
bool rows_times_rows_for(uint32_t type, const uint8_t* w, size_t rows,
                         size_t row_bytes, size_t cols, size_t n,
                         const Activations& x, float* out) {
  if (cols % 128 != 0) {
    return false;
  }
  switch (type) {
    case kQ4_0:
      rows_times_rows<false>(decode_q4_0<DecodedRow>, w, rows, row_bytes, cols, n, x, out);
      return true;
    case kQ5_0:
      rows_times_rows<false>(decode_q5_0<DecodedRow>, w, rows, row_bytes, cols, n, x, out);
      return true;
    case kQ8_0:
      rows_times_rows<true>(decode_q8_0<DecodedRow>, w, rows, row_bytes, cols, n, x, out);
      return true;
    case kQ4_K:
      rows_times_rows<false>(decode_k_4_5<false, DecodedRow>, w, rows, row_bytes, cols, n,
                             x, out);
      return true;
    case kQ5_K:
      rows_times_rows<false>(decode_k_4_5<true, DecodedRow>, w, rows, row_bytes, cols, n,
                             x, out);
      return true;
    case kQ6_K:
      rows_times_rows<false>(decode_q6_k<DecodedRow>, w, rows, row_bytes, cols, n, x, out);
      return true;
    default:
      return false;
  }
}

#define AVX512                                                          \
  __attribute__((target(                                               \
      "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

/// Whether this CPU runs the 512-bit kernels below (asked once).
bool cpu_has_avx512_vnni() {
  static const bool has = [] {
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
  }();
  return has;
}

/// Activations laid out for the 512-bit kernels, which multiply 64 values
/// at a time with `vpdpbusd` (two blocks of the 32-value formats): 16
/// int32 lanes, each the sum of 4 products, lanes 4g to 4g + 3 covering
/// group g of 16 values. The weights enter as unsigned bytes, their value
/// plus `offset` (8 for Q4_0, 16 for Q5_0, 128 for Q8_0, 32 for Q6_K, 0
/// for Q4_K); the products of
/// the offset come off through `offsets` (−offset · Σ q of group g in lane
/// 4g, 0 in the others), the lanes' starting value. `scales` holds each
/// group's scale in its 4 lanes.
struct WideActivations {
  const int8_t* q;
  std::vector<int32_t> offsets;
  std::vector<float> scales;

  WideActivations(const Activations& x, size_t cols, int offset)
      : q(x.q), offsets(cols / 4, 0), scales(cols / 4) {
    for (size_t g = 0; g < cols / 16; ++g) {
      int32_t sum = 0;
      for (size_t j = 0; j < 16; ++j) {
        sum += x.q[16 * g + j];
      }
      offsets[4 * g] = -offset * sum;
      for (size_t l = 0; l < 4; ++l) {
        scales[4 * g + l] = x.scales[g];
      }
    }
  }
};

/// Two blocks' 16 bytes of nibbles each (low: values 0–15, high: 16–31) as
/// 64 bytes in value order.
AVX512 inline __m512i nibbles_wide(const uint8_t* p0, const uint8_t* p1) {
  const __m256i n0 = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0)));
  const __m256i n1 = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1)));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(n0), n1, 1);
  // The upper 16 bytes of each block's 32 take the high nibbles.
  const __m512i shifts = _mm512_set_epi64(
      0x0004000400040004, 0x0004000400040004, 0, 0, 0x0004000400040004,
      0x0004000400040004, 0, 0);
  return _mm512_and_si512(_mm512_srlv_epi16(both, shifts),
                          _mm512_set1_epi8(0x0F));
}

/// Q4_0's two blocks as unsigned bytes: q, its value plus 8.
struct Q4_0Wide {
  static constexpr size_t kBytes = 18;
  static constexpr int kOffset = 8;
  AVX512 static __m512i values(const uint8_t* b0, const uint8_t* b1) {
    return nibbles_wide(b0 + 2, b1 + 2);
  }
};

/// Q5_0's two blocks as unsigned bytes: q with its fifth bit, its value
/// plus 16.
struct Q5_0Wide {
  static constexpr size_t kBytes = 22;
  static constexpr int kOffset = 16;
  AVX512 static __m512i values(const uint8_t* b0, const uint8_t* b1) {
    uint32_t h0, h1;
    std::memcpy(&h0, b0 + 2, sizeof h0);
    std::memcpy(&h1, b1 + 2, sizeof h1);
    const __mmask64 fifth =
        static_cast<uint64_t>(h0) | (static_cast<uint64_t>(h1) << 32);
    const __m512i q = nibbles_wide(b0 + 6, b1 + 6);
    return _mm512_mask_add_epi8(q, fifth, q, _mm512_set1_epi8(0x10));
  }
};

/// Q8_0's two blocks as unsigned bytes: the int8 values plus 128.
struct Q8_0Wide {
  static constexpr size_t kBytes = 34;
  static constexpr int kOffset = 128;
  AVX512 static __m512i values(const uint8_t* b0, const uint8_t* b1) {
    const __m512i q =
        _mm512_inserti64x4(_mm512_castsi256_si512(load32(b0 + 2)),
                           load32(b1 + 2), 1);
    return _mm512_xor_si512(q, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
};

/// One row of a 32-value format, two blocks at a time; an odd last block
/// by the 256-bit kernel `Narrow`.
template <typename Wide, typename Narrow>
AVX512 float row_wide(const uint8_t* row, size_t blocks,
                      const WideActivations& wide, const Activations& x) {
  __m512 acc = _mm512_setzero_ps();
  size_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const uint8_t* b0 = row + b * Wide::kBytes;
    const uint8_t* b1 = b0 + Wide::kBytes;
    prefetch_ahead(b0, 1);
    const __m512i ints = _mm512_dpbusd_epi32(
        _mm512_loadu_si512(wide.offsets.data() + 8 * b),
        Wide::values(b0, b1), _mm512_loadu_si512(wide.q + 32 * b));
    const __m512 d = _mm512_insertf32x8(_mm512_set1_ps(f16_at(b0)),
                                        _mm256_set1_ps(f16_at(b1)), 1);
    const __m512 scales =
        _mm512_mul_ps(d, _mm512_loadu_ps(wide.scales.data() + 8 * b));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ints), scales, acc);
  }
  float sum = _mm512_reduce_add_ps(acc);
  if (b < blocks) {
    const Activations rest{x.q + 32 * b, x.scales + 2 * b, x.sums + 2 * b};
    sum += row_of_32<Narrow>(row + b * Wide::kBytes, 1, rest);
  }
  return sum;
}

/// `rows` rows of a 32-value format by the 512-bit kernel.
template <typename Wide, typename Narrow>
AVX512 void rows_wide(const uint8_t* w, size_t rows, size_t row_bytes,
                      size_t cols, const Activations& x, float* out) {
  const WideActivations wide(x, cols, Wide::kOffset);
  const size_t blocks = cols / 32;
  for (size_t r = 0; r < rows; ++r) {
    out[r] = row_wide<Wide, Narrow>(w + r * row_bytes, blocks, wide, x);
  }
}

/// Each of 4 scales (int8, from `first`) in 4 int32 lanes, as the lanes of
/// 64 values' 4 groups lie.
AVX512 inline __m512 four_scales(const __m128i scales, int first) {
  const __m128i spread = _mm_add_epi8(
      _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
      _mm_set1_epi8(static_cast<char>(first)));
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_shuffle_epi8(scales, spread)));
}

/// One row of Q6_K blocks, 64 values at a time: q in [0, 63] as unsigned
/// bytes (its value plus 32, the activations' offsets taking the 32 off),
/// each group's int8 scale times d.
AVX512 float row_q6_k_wide(const uint8_t* row, size_t blocks,
                           const WideActivations& wide) {
  __m512 acc = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i low2 = _mm512_set1_epi8(0x03);
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * 210;
    prefetch_ahead(block, 210);
    const __m128i sc =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192));
    const __m512 d = _mm512_set1_ps(f16_at(block + 208));
    for (int n = 0; n < 2; ++n) {
      const __m512i ql = _mm512_loadu_si512(block + 64 * n);
      const __m256i qh = load32(block + 128 + 32 * n);
      // Values 0–31 take bits 0–1 of qh, 32–63 bits 2–3, 64–95 bits 4–5,
      // 96–127 bits 6–7.
      const __m512i qh01 = _mm512_inserti64x4(_mm512_castsi256_si512(qh),
                                              _mm256_srli_epi16(qh, 2), 1);
      const __m512i qh23 = _mm512_srli_epi16(qh01, 4);
      const __m512i q[2] = {
          _mm512_or_si512(
              _mm512_and_si512(ql, low4),
              _mm512_slli_epi16(_mm512_and_si512(qh01, low2), 4)),
          _mm512_or_si512(
              _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
              _mm512_slli_epi16(_mm512_and_si512(qh23, low2), 4)),
      };
      for (int k = 0; k < 2; ++k) {
        const size_t v = 256 * b + 128 * n + 64 * k;  // the first value
        const __m512i ints = _mm512_dpbusd_epi32(
            _mm512_loadu_si512(wide.offsets.data() + v / 4), q[k],
            _mm512_loadu_si512(wide.q + v));
        const __m512 scales = _mm512_mul_ps(
            _mm512_mul_ps(d, four_scales(sc, 8 * n + 4 * k)),
            _mm512_loadu_ps(wide.scales.data() + v / 4));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ints), scales, acc);
      }
    }
  }
  return _mm512_reduce_add_ps(acc);
}

/// One row of Q4_K blocks, 64 values (two sub-blocks) at a time: q in
/// [0, 15] as unsigned bytes, d · sc per sub-block; the minimums come off
/// through the groups' activation sums, as in the 256-bit kernel.
AVX512 float row_q4_k_wide(const uint8_t* row, size_t blocks,
                           const WideActivations& wide,
                           const Activations& x) {
  __m512 acc = _mm512_setzero_ps();
  float offsets = 0.0f;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * 144;
    prefetch_ahead(block, 144);
    const float d = f16_at(block);
    const float dmin = f16_at(block + 2);
    uint8_t sc[8], m[8];
    k_scales(block + 4, sc, m);
    for (int p = 0; p < 4; ++p) {
      const __m256i q32 = load32(block + 16 + 32 * p);
      const __m512i q = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_and_si256(q32, low4)),
          _mm256_and_si256(_mm256_srli_epi16(q32, 4), low4), 1);
      const size_t v = 256 * b + 64 * p;  // the first value
      const __m512i ints = _mm512_dpbusd_epi32(
          _mm512_setzero_si512(), q, _mm512_loadu_si512(wide.q + v));
      const __m512 subs =
          _mm512_insertf32x8(_mm512_set1_ps(d * sc[2 * p]),
                             _mm256_set1_ps(d * sc[2 * p + 1]), 1);
      const __m512 scales =
          _mm512_mul_ps(subs, _mm512_loadu_ps(wide.scales.data() + v / 4));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ints), scales, acc);
      const size_t g = v / 16;
      offsets -= dmin * (m[2 * p] * (x.sums[g] + x.sums[g + 1]) +
                         m[2 * p + 1] * (x.sums[g + 2] + x.sums[g + 3]));
    }
  }
  return _mm512_reduce_add_ps(acc) + offsets;
}

/// `rows` rows of Q6_K by the 512-bit kernel.
AVX512 void rows_q6_k_wide(const uint8_t* w, size_t rows, size_t row_bytes,
                           size_t cols, const Activations& x, float* out) {
  const WideActivations wide(x, cols, 32);
  for (size_t r = 0; r < rows; ++r) {
    out[r] = row_q6_k_wide(w + r * row_bytes, cols / 256, wide);
  }
}

/// `rows` rows of Q4_K by the 512-bit kernel.
AVX512 void rows_q4_k_wide(const uint8_t* w, size_t rows, size_t row_bytes,
                           size_t cols, const Activations& x, float* out) {
  const WideActivations wide(x, cols, 0);
  for (size_t r = 0; r < rows; ++r) {
    out[r] = row_q4_k_wide(w + r * row_bytes, cols / 256, wide, x);
  }
}

// ---- Several rows of activations, 512-bit (prefill) ----
//
// As the 256-bit multi-row product, tiles of 4 weight rows are decoded once
// and multiplied with every row of activations, here 2 activation rows at a
// time and 64 values per `vpdpbusd`: the weights as unsigned bytes (the
// stored integer plus the format's offset; Q8_0's plus 128), each group's 4
// integer lanes scaled by the product of the weights' and the activations'
// scales. The offsets (and Q4_K's and Q5_K's minimums) come off in float
// through each group's additive term times its activation sum, 16 groups a
// vector in the same accumulators, so that no integer lane needs a starting
// value. Four tiles are decoded at a time and each pair of activation rows
// meets all four while it is in L1.

/// Groups of 16 values per vector of additive terms: rows of them padded
/// to whole vectors.
inline size_t padded_groups(size_t cols) { return (cols / 16 + 15) / 16 * 16; }

/// Weight rows decoded for the 512-bit multi-row product.
struct WideTile {
  static constexpr size_t kRows = 4;
  size_t cols;
  std::vector<uint8_t> q;  // `cols` unsigned integers a row
  std::vector<float> s4;   // each group's scale in its 4 lanes, `cols / 4`
  std::vector<float> m;    // each group's additive term, `padded_groups`

  explicit WideTile(size_t cols)
      : cols(cols),
        q(kRows * cols),
        s4(kRows * cols / 4),
        m(kRows * padded_groups(cols), 0.0f) {}

  uint8_t* q_row(size_t r) { return q.data() + r * cols; }
  float* s4_row(size_t r) { return s4.data() + r * cols / 4; }
  float* m_row(size_t r) { return m.data() + r * padded_groups(cols); }
};

/// One row of a `WideTile` as the decoders write it.
using WideRow = RowOutputs<FourLaneScales>;

using WideDecoder = void (*)(const uint8_t*, size_t, const WideRow&);

/// A format as the 512-bit multi-row product takes it: its decoder, and
/// whether its integers are signed (then made unsigned by adding 128, and
/// their additive term −128 times the group's scale).
struct WideFormat {
  WideDecoder decode;
  bool flip;
};

/// Activation rows for the 512-bit multi-row product: the caller's
/// integers, each group's scale in its 4 lanes, and the groups' sums in
/// rows of `padded_groups`.
struct WideActivationRows {
  const int8_t* q;
  size_t cols;
  std::vector<float> s4;
  std::vector<float> sums;

  WideActivationRows(const Activations& x, size_t n, size_t cols)
      : q(x.q), cols(cols), s4(n * cols / 4), sums(n * padded_groups(cols)) {
    const size_t groups = cols / 16;
    for (size_t c = 0; c < n; ++c) {
      for (size_t g = 0; g < groups; ++g) {
        const float s = x.scales[c * groups + g];
        std::fill(s4.begin() + (c * groups + g) * 4,
                  s4.begin() + (c * groups + g + 1) * 4, s);
        sums[c * padded_groups(cols) + g] = x.sums[c * groups + g];
      }
    }
  }
};

/// The sums of the 16 lanes of `a[0]` to `a[3]`, in that order.
AVX512 inline __m128 four_sums(const __m512 a[4]) {
  const __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], 0x44),
                                   _mm512_shuffle_f32x4(a[0], a[1], 0xEE));
  const __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[3], 0x44),
                                   _mm512_shuffle_f32x4(a[2], a[3], 0xEE));
  // Each 128-bit quarter i now holds 4 partial sums of a[i].
  const __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, 0x88),
                                 _mm512_shuffle_f32x4(a01, a23, 0xDD));
  const __m512 p = _mm512_add_ps(q, _mm512_permute_ps(q, 0xB1));
  const __m512 t = _mm512_add_ps(p, _mm512_permute_ps(p, 0x4E));
  return _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, t));
}

/// acc + (the integer sums of unsigned weights `w` against activations `x`,
/// 64 values) · `scales`.
AVX512 inline __m512 wide_step(__m512 acc, __m512i w, __m512i x,
                               __m512 scales) {
  // A zero idiom of its own for each product: compilers otherwise copy one
  // zero register before each `vpdpbusd`, an instruction that takes an
  // execution port where the idiom takes none.
  __m512i ints;
  asm volatile("vpxord %0, %0, %0" : "=v"(ints));
  ints = _mm512_dpbusd_epi32(ints, w, x);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(ints), scales, acc);
}

/// 64 values of a tile's four weight rows (unsigned integers, each group's
/// scale in its 4 lanes).
struct WideStep {
  __m512i w[4];
  __m512 s[4];

  /// `a0` to `a3` (one per weight row) plus the products with activations
  /// `x` of scales `t`.
  AVX512 void times(__m512i x, __m512 t, __m512& a0, __m512& a1, __m512& a2,
                    __m512& a3) const {
    a0 = wide_step(a0, w[0], x, _mm512_mul_ps(s[0], t));
    a1 = wide_step(a1, w[1], x, _mm512_mul_ps(s[1], t));
    a2 = wide_step(a2, w[2], x, _mm512_mul_ps(s[2], t));
    a3 = wide_step(a3, w[3], x, _mm512_mul_ps(s[3], t));
  }
};

/// Rows `r0` to `r0 + rows − 1` of `out` (4 at most) for activation rows
/// `c` and `c + 1` (the second only where `two_inputs`).
AVX512 inline void wide_tile_product(WideTile& w, size_t rows,
                                     const WideActivationRows& x, size_t c,
                                     bool two_inputs, float* out,
                                     size_t stride) {
  const size_t cols = w.cols;
  const size_t c1 = two_inputs ? c + 1 : c;
  const size_t pg = padded_groups(cols);
  const int8_t* xq0 = x.q + c * cols;
  const int8_t* xq1 = x.q + c1 * cols;
  const float* xs0 = x.s4.data() + c * cols / 4;
  const float* xs1 = x.s4.data() + c1 * cols / 4;
  const uint8_t* wq = w.q.data();
  const float* ws = w.s4.data();
  const size_t qs = cols, ss = cols / 4;  // strides between tile rows
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
  __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  // The additive terms first, 16 groups a vector.
  for (size_t g = 0; g < pg; g += 16) {
    const __m512 u0 = _mm512_loadu_ps(x.sums.data() + c * pg + g);
    const __m512 u1 = _mm512_loadu_ps(x.sums.data() + c1 * pg + g);
    const __m512 m0 = _mm512_loadu_ps(w.m_row(0) + g);
    const __m512 m1 = _mm512_loadu_ps(w.m_row(1) + g);
    const __m512 m2 = _mm512_loadu_ps(w.m_row(2) + g);
    const __m512 m3 = _mm512_loadu_ps(w.m_row(3) + g);
    a00 = _mm512_fmadd_ps(m0, u0, a00);
    a01 = _mm512_fmadd_ps(m1, u0, a01);
    a02 = _mm512_fmadd_ps(m2, u0, a02);
    a03 = _mm512_fmadd_ps(m3, u0, a03);
    a10 = _mm512_fmadd_ps(m0, u1, a10);
    a11 = _mm512_fmadd_ps(m1, u1, a11);
    a12 = _mm512_fmadd_ps(m2, u1, a12);
    a13 = _mm512_fmadd_ps(m3, u1, a13);
  }
  for (size_t v = 0, g = 0; v < cols; v += 64, g += 16) {
    const WideStep tile{
        {_mm512_loadu_si512(wq + v), _mm512_loadu_si512(wq + qs + v),
         _mm512_loadu_si512(wq + 2 * qs + v),
         _mm512_loadu_si512(wq + 3 * qs + v)},
        {_mm512_loadu_ps(ws + g), _mm512_loadu_ps(ws + ss + g),
         _mm512_loadu_ps(ws + 2 * ss + g), _mm512_loadu_ps(ws + 3 * ss + g)}};
    tile.times(_mm512_loadu_si512(xq0 + v), _mm512_loadu_ps(xs0 + g), a00,
               a01, a02, a03);
    tile.times(_mm512_loadu_si512(xq1 + v), _mm512_loadu_ps(xs1 + g), a10,
               a11, a12, a13);
  }
  const __m512 first[4] = {a00, a01, a02, a03};
  const __m512 second[4] = {a10, a11, a12, a13};
  const __mmask8 valid = static_cast<__mmask8>((1u << rows) - 1);
  _mm_mask_storeu_ps(out + c * stride, valid, four_sums(first));
  if (two_inputs) {
    _mm_mask_storeu_ps(out + c1 * stride, valid, four_sums(second));
  }
}

/// Decodes weight rows `r0` to `r0 + 3` of `w` into `tile` (a short last
/// tile repeats its last row, computed and not written).
AVX512 void decode_wide_tile(const WideFormat& format, const uint8_t* w,
                             size_t rows, size_t row_bytes, size_t r0,
                             WideTile& tile) {
  const size_t cols = tile.cols;
  for (size_t i = 0; i < WideTile::kRows; ++i) {
    const size_t r = std::min(r0 + i, rows - 1);
    format.decode(w + r * row_bytes, cols,
                  WideRow{tile.q_row(i), tile.s4_row(i), tile.m_row(i)});
    if (format.flip) {
      const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
      for (size_t v = 0; v < cols; v += 64) {
        uint8_t* p = tile.q_row(i) + v;
        _mm512_storeu_si512(p, _mm512_xor_si512(_mm512_loadu_si512(p), flip));
      }
      for (size_t g = 0; g < cols / 16; ++g) {
        tile.m_row(i)[g] = -128.0f * tile.s4_row(i)[4 * g];
      }
    }
  }
}

/// `out[c · rows + r]` = row r of `w` against each of the `n` rows of `x`,
/// by the 512-bit tile product (`cols` whole 64-value steps).
AVX512 void rows_times_rows_wide(const WideFormat& format, const uint8_t* w,
                                 size_t rows, size_t row_bytes, size_t cols,
                                 size_t n, const Activations& x, float* out) {
  constexpr size_t kTiles = 4;
  const WideActivationRows acts(x, n, cols);
  std::vector<WideTile> tiles(kTiles, WideTile(cols));
  for (size_t b0 = 0; b0 < rows; b0 += kTiles * WideTile::kRows) {
    size_t count = 0;  // tiles in this block
    for (; count < kTiles && b0 + count * WideTile::kRows < rows; ++count) {
      decode_wide_tile(format, w, rows, row_bytes,
                       b0 + count * WideTile::kRows, tiles[count]);
    }
    for (size_t c = 0; c < n; c += 2) {
      for (size_t t = 0; t < count; ++t) {
        const size_t r0 = b0 + t * WideTile::kRows;
        wide_tile_product(tiles[t], std::min(WideTile::kRows, rows - r0), acts,
                          c, c + 1 < n, out + r0, rows);
      }
    }
  }
}

/// The 512-bit multi-row product's view of `type`, or false where it has
/// none.
bool wide_format_for(uint32_t type, WideFormat* format) {
  switch (type) {
    case kQ4_0:
      *format = {decode_q4_0<WideRow>, false};
      return true;
    case kQ5_0:
      *format = {decode_q5_0<WideRow>, false};
      return true;
    case kQ8_0:
      *format = {decode_q8_0<WideRow>, true};
      return true;
    case kQ4_K:
      *format = {decode_k_4_5<false, WideRow>, false};
      return true;
    case kQ5_K:
      *format = {decode_k_4_5<true, WideRow>, false};
      return true;
    case kQ6_K:
      *format = {decode_q6_k<WideRow>, false};
      return true;
    default:
      return false;
  }
}

/// The 512-bit multi-row product for `type` in `family`, or false where
/// there is none (or where `cols` is not whole 64-value steps).
bool rows_times_rows_wide_for(mlx_cpu_kernels family, uint32_t type,
                              const uint8_t* w, size_t rows, size_t row_bytes,
                              size_t cols, size_t n, const Activations& x,
                              float* out) {
  WideFormat format;
  if (family != MLX_CPU_KERNELS_AVX512 || !cpu_has_avx512_vnni() ||
      cols % 64 != 0 || !wide_format_for(type, &format)) {
    return false;
  }
  rows_times_rows_wide(format, w, rows, row_bytes, cols, n, x, out);
  return true;
}

using RowsKernel = void (*)(const uint8_t*, size_t, size_t, size_t,
                            const Activations&, float*);

/// The 512-bit kernel for `type` in `family` (on this CPU), or null.
RowsKernel rows_kernel_wide(mlx_cpu_kernels family, uint32_t type) {
  if (family != MLX_CPU_KERNELS_AVX512 || !cpu_has_avx512_vnni()) {
    return nullptr;
  }
  switch (type) {
    case kQ4_0:
      return rows_wide<Q4_0Wide, Q4_0>;
    case kQ5_0:
      return rows_wide<Q5_0Wide, Q5_0>;
    case kQ8_0:
      return rows_wide<Q8_0Wide, Q8_0>;
    case kQ4_K:
      return rows_q4_k_wide;
    case kQ6_K:
      return rows_q6_k_wide;
    default:
      return nullptr;
  }
}

using RowKernel = float (*)(const uint8_t*, size_t, const Activations&);

/// The 256-bit kernel for `type` in `family` (on this CPU), or null.
RowKernel row_kernel(mlx_cpu_kernels family, uint32_t type) {
  if (family == MLX_CPU_KERNELS_PORTABLE || !cpu_has_avx2()) {
    return nullptr;
  }
  switch (type) {
    case kQ4_0:
      return row_q4_0;
    case kQ5_0:
      return row_q5_0;
    case kQ8_0:
      return row_q8_0;
    case kQ4_K:
      return row_q4_k;
    case kQ5_K:
      return row_q5_k;
    case kQ6_K:
      return row_q6_k;
    default:
      return nullptr;
  }
}

#else

using RowKernel = float (*)(const uint8_t*, size_t, const void*);

RowKernel row_kernel(mlx_cpu_kernels, uint32_t) { return nullptr; }

bool cpu_has_avx2() { return false; }

bool cpu_has_avx512_vnni() { return false; }

#endif

/// Whether this CPU runs `family`.
bool supported(mlx_cpu_kernels family) {
  switch (family) {
    case MLX_CPU_KERNELS_PORTABLE:
      return true;
    case MLX_CPU_KERNELS_AVX2:
      return cpu_has_avx2();
    case MLX_CPU_KERNELS_AVX512:
      return cpu_has_avx512_vnni();
  }
  return false;
}

/// `family`'s name, for messages.
std::string family_name(mlx_cpu_kernels family) {
  switch (family) {
    case MLX_CPU_KERNELS_PORTABLE:
      return "portable";
    case MLX_CPU_KERNELS_AVX2:
      return "avx2";
    case MLX_CPU_KERNELS_AVX512:
      return "avx512";
  }
  return "unknown (" + std::to_string(static_cast<int>(family)) + ")";
}

/// Throws unless this CPU runs `family`.
void check_family(mlx_cpu_kernels family) {
  if (!supported(family)) {
    throw std::invalid_argument("the " + family_name(family) +
                                " CPU kernels do not run on this CPU");
  }
}

/// Whether the affine kernel of `family` takes `bits`-bit values in groups
/// of `group_size` (the 256-bit kernel, in both x86 families).
bool affine_kernel(mlx_cpu_kernels family, int bits, int group_size) {
  return family != MLX_CPU_KERNELS_PORTABLE && supported(family) &&
         cpu_has_avx2() && (bits == 4 || bits == 8) &&
         (group_size == 32 || group_size == 64 || group_size == 128);
}

}  // namespace

extern "C" {

int mlx_cpu_kernels_supported(bool* out, mlx_cpu_kernels family) {
  return guard([&] { *need(out, "out") = supported(family); });
}

int mlx_block_rows_dot_available(bool* out, mlx_cpu_kernels family,
                                 uint32_t ggml_type) {
  return guard([&] {
    check_family(family);
    *need(out, "out") = row_kernel(family, ggml_type) != nullptr;
  });
}

int mlx_block_rows_dot(float* out, mlx_cpu_kernels family, uint32_t ggml_type,
                       const uint8_t* w, size_t rows, size_t row_bytes,
                       size_t cols, size_t n, const int8_t* x,
                       const float* x_scales, const float* x_sums) {
  return guard([&] {
    check_family(family);
    const RowKernel kernel = row_kernel(family, ggml_type);
    if (kernel == nullptr) {
      throw std::invalid_argument("no block-row kernel for ggml type " +
                                  std::to_string(ggml_type) + " in the " +
                                  family_name(family) + " CPU kernels");
    }
    const BlockShape shape = block_shape(ggml_type);
    if (cols % shape.values != 0 ||
        row_bytes != cols / shape.values * shape.bytes) {
      throw std::invalid_argument(
          std::to_string(cols) + " values of ggml type " +
          std::to_string(ggml_type) + " are not " + std::to_string(row_bytes) +
          " bytes of whole blocks");
    }
    if (rows == 0 || n == 0) {
      return;
    }
    need(out, "out");
    need(w, "w");
    need(x, "x");
    need(x_scales, "x_scales");
    need(x_sums, "x_sums");
#if defined(__x86_64__)
    if (n >= kMinRowsForTiles &&
        rows_times_rows_wide_for(family, ggml_type, w, rows, row_bytes, cols,
                                 n, Activations{x, x_scales, x_sums}, out)) {
      return;
    }
    if (n >= kMinRowsForTiles &&
        rows_times_rows_for(ggml_type, w, rows, row_bytes, cols, n,
                            Activations{x, x_scales, x_sums}, out)) {
      return;
    }
    const RowsKernel wide = rows_kernel_wide(family, ggml_type);
    const size_t blocks = cols / shape.values;
    for (size_t m = 0; m < n; ++m) {
      const Activations acts{x + m * cols, x_scales + m * cols / 16,
                             x_sums + m * cols / 16};
      float* row_out = out + m * rows;
      if (wide != nullptr) {
        wide(w, rows, row_bytes, cols, acts, row_out);
        continue;
      }
      for (size_t r = 0; r < rows; ++r) {
        row_out[r] = kernel(w + r * row_bytes, blocks, acts);
      }
    }
#endif
  });
}

int mlx_affine_rows_dot_available(bool* out, mlx_cpu_kernels family,
                                  int bits, int group_size) {
  return guard([&] {
    check_family(family);
    *need(out, "out") = affine_kernel(family, bits, group_size);
  });
}

int mlx_affine_rows_dot(float* out, mlx_cpu_kernels family, int bits,
                        int group_size, const uint8_t* w, const float* scales,
                        const float* biases, size_t rows, size_t cols,
                        const int8_t* x, const float* x_scales,
                        const float* x_sums) {
  return guard([&] {
    check_family(family);
    if (!affine_kernel(family, bits, group_size)) {
      throw std::invalid_argument(
          "no affine row kernel for " + std::to_string(bits) +
          " bits in groups of " + std::to_string(group_size) + " in the " +
          family_name(family) + " CPU kernels");
    }
    if (cols % static_cast<size_t>(group_size) != 0) {
      throw std::invalid_argument(std::to_string(cols) +
                                  " values are not whole groups of " +
                                  std::to_string(group_size));
    }
    if (rows == 0) {
      return;
    }
    need(out, "out");
    need(w, "w");
    need(scales, "scales");
    need(biases, "biases");
    need(x, "x");
    need(x_scales, "x_scales");
    need(x_sums, "x_sums");
#if defined(__x86_64__)
    const size_t row_bytes = cols * static_cast<size_t>(bits) / 8;
    const size_t groups = cols / static_cast<size_t>(group_size);
    const AffineRows m{w,      row_bytes, scales,    biases,
                       groups, bits,      group_size};
    affine_rows(m, rows, Activations{x, x_scales, x_sums}, out);
#endif
  });
}

}  // extern "C"
