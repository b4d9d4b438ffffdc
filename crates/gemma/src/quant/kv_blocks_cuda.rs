//! ggml's 32-value KV block formats as CUDA device functions: the
//! quantizers of [`super::quantize`] and the decoders of [`super::dequant`],
//! operation for operation, so that a GPU cache writes the bytes and reads
//! back the values the CPU does. Every rounding step is an explicit
//! intrinsic (`__fmul_rn`, `__fadd_rn`, `__fdiv_rn`, `__dadd_rn`…): the CUDA
//! compiler would otherwise fuse a multiply and an add where Rust does not.
//!
//! Types (the `Q` template argument): 0 `q8_0`, 1 `q4_0`, 2 `q4_1`, 3
//! `q5_0`, 4 `q5_1`, 5 `iq4_nl`. Test `cuda_host` compiles these
//! functions for the host and holds them byte for byte to the Rust ones.

use super::dtype::GgufDtype;

/// The CUDA type number of a KV block format (see the module
/// documentation), `None` for other types.
pub fn kv_block_type(dtype: GgufDtype) -> Option<i32> {
    Some(match dtype {
        GgufDtype::Q8_0 => 0,
        GgufDtype::Q4_0 => 1,
        GgufDtype::Q4_1 => 2,
        GgufDtype::Q5_0 => 3,
        GgufDtype::Q5_1 => 4,
        GgufDtype::IQ4_NL => 5,
        _ => return None,
    })
}

/// The device functions: `gemma_kv_quantize<Q>(x, out)` writes one block
/// of the 32 floats `x`, `gemma_kv_dequantize<Q>(block, y)` decodes one,
/// `gemma_kv_value<Q>(block, j)` its value j.
pub const KV_BLOCKS_CUDA: &str = r#"
template <int Q> struct gemma_kv_type;
template <> struct gemma_kv_type<0> { static constexpr int BYTES = 34; };
template <> struct gemma_kv_type<1> { static constexpr int BYTES = 18; };
template <> struct gemma_kv_type<2> { static constexpr int BYTES = 20; };
template <> struct gemma_kv_type<3> { static constexpr int BYTES = 22; };
template <> struct gemma_kv_type<4> { static constexpr int BYTES = 24; };
template <> struct gemma_kv_type<5> { static constexpr int BYTES = 18; };

__device__ const signed char GEMMA_IQ4_NL_LEVELS[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// The f16 bits of `v`, rounded to nearest, ties to even, in integer
// arithmetic: NVRTC 13.0 for sm_90 stored 0 for the low byte of
// `__float2half_rn`'s result when it was written as a byte (the H100,
// 2026-12-06), so no f16 conversion instruction is used here.
__device__ __forceinline__ unsigned int gemma_kv_f16_bits(float v) {
  const unsigned int x = __float_as_uint(v);
  const unsigned int sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  unsigned int h;
  if (mag > 0x7f800000u) {
    h = 0x7e00u;
  } else if (mag >= 0x477ff000u) {
    h = 0x7c00u;
  } else if (mag <= 0x33000000u) {
    h = 0u;
  } else if ((mag >> 23) < 113u) {
    const unsigned int m = (mag & 0x7fffffu) | 0x800000u;
    const unsigned int shift = 126u - (mag >> 23);
    const unsigned int rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    h = m >> shift;
    if (rem > half || (rem == half && (h & 1u))) ++h;
  } else {
    const unsigned int r = mag - (112u << 23), rem = r & 0x1fffu;
    h = r >> 13;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  }
  return sign | h;
}

// `v` as little-endian f16 bytes at `out`.
__device__ __forceinline__ void gemma_kv_put_f16(unsigned char* out, float v) {
  const unsigned int bits = gemma_kv_f16_bits(v);
  out[0] = static_cast<unsigned char>(bits & 255u);
  out[1] = static_cast<unsigned char>(bits >> 8);
}

__device__ __forceinline__ float gemma_kv_f16_at(const unsigned char* b) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b[0] | (b[1] << 8))));
}

// 1 / d, or 0 where d is 0.
__device__ __forceinline__ float gemma_kv_inverse(float d) {
  return d == 0.0f ? 0.0f : __fdiv_rn(1.0f, d);
}

// The value of largest magnitude, the first of equals; +0 for zeros.
__device__ __forceinline__ float gemma_kv_signed_max(const float x[32]) {
  float best = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (fabsf(x[j]) > fabsf(best)) best = x[j];
  }
  return best;
}

// The largest and smallest values, each the first of equals.
__device__ __forceinline__ void gemma_kv_max_min(const float x[32], float& hi, float& lo) {
  hi = x[0];
  lo = x[0];
  for (int j = 1; j < 32; ++j) {
    if (x[j] > hi) hi = x[j];
    if (x[j] < lo) lo = x[j];
  }
}

// trunc(t) as a level in 0 … top (NaN and negatives 0, as Rust's `as u8`).
__device__ __forceinline__ int gemma_kv_level(float t, int top) {
  const float whole = truncf(t);
  const int level = !(whole > 0.0f) ? 0 : (whole >= 255.0f ? 255 : static_cast<int>(whole));
  return level < top ? level : top;
}

// trunc(f32(x · id + offset)), the product and sum in f64.
__device__ __forceinline__ int gemma_kv_level_fma(float x, float id, double offset, int top) {
  const double sum = __dadd_rn(__dmul_rn(static_cast<double>(x), static_cast<double>(id)), offset);
  return gemma_kv_level(__double2float_rn(sum), top);
}

// trunc((x − min) · id + 0.5) in f32.
__device__ __forceinline__ int gemma_kv_level_from_min(float x, float min, float id, int top) {
  return gemma_kv_level(__fadd_rn(__fmul_rn(__fsub_rn(x, min), id), 0.5f), top);
}

// Levels as ggml packs them: value j's low nibble in byte j % 16 (the high
// nibble for j ≥ 16).
__device__ __forceinline__ void gemma_kv_put_nibbles(unsigned char* out, const int q[32]) {
  for (int j = 0; j < 16; ++j) out[j] = static_cast<unsigned char>((q[j] & 15) | ((q[j + 16] & 15) << 4));
}

// Bit 4 of every level, value j at bit j of a little-endian u32.
__device__ __forceinline__ void gemma_kv_put_high_bits(unsigned char* out, const int q[32]) {
  unsigned int bits = 0;
  for (int j = 0; j < 32; ++j) bits |= static_cast<unsigned int>(q[j] >> 4) << j;
  for (int k = 0; k < 4; ++k) out[k] = static_cast<unsigned char>(bits >> (8 * k));
}

// The index of the IQ4_NL level nearest x, the upper one on a tie.
__device__ __forceinline__ int gemma_kv_nearest_iq4_nl(float x) {
  if (x <= GEMMA_IQ4_NL_LEVELS[0]) return 0;
  if (x >= GEMMA_IQ4_NL_LEVELS[15]) return 15;
  int low = 0, high = 15;
  while (high - low > 1) {
    const int middle = (low + high) / 2;
    if (x < GEMMA_IQ4_NL_LEVELS[middle]) high = middle; else low = middle;
  }
  const float below = __fsub_rn(x, static_cast<float>(GEMMA_IQ4_NL_LEVELS[high - 1]));
  const float above = __fsub_rn(static_cast<float>(GEMMA_IQ4_NL_LEVELS[high]), x);
  return below < above ? high - 1 : high;
}

template <int Q>
__device__ __forceinline__ void gemma_kv_quantize(const float x[32], unsigned char* out) {
  int q[32];
  if constexpr (Q == 0) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[j]));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = gemma_kv_inverse(d);
    gemma_kv_put_f16(out, d);
    for (int j = 0; j < 32; ++j) {
      const float r = roundf(__fmul_rn(x[j], id));
      const int v = r != r ? 0 : (r <= -128.0f ? -128 : (r >= 127.0f ? 127 : static_cast<int>(r)));
      out[2 + j] = static_cast<unsigned char>(static_cast<signed char>(v));
    }
  } else if constexpr (Q == 1 || Q == 3) {
    const float d = __fdiv_rn(gemma_kv_signed_max(x), Q == 1 ? -8.0f : -16.0f);
    const float id = gemma_kv_inverse(d);
    for (int j = 0; j < 32; ++j) q[j] = gemma_kv_level_fma(x[j], id, Q == 1 ? 8.5 : 16.5, Q == 1 ? 15 : 31);
    gemma_kv_put_f16(out, d);
    if constexpr (Q == 1) {
      gemma_kv_put_nibbles(out + 2, q);
    } else {
      gemma_kv_put_high_bits(out + 2, q);
      gemma_kv_put_nibbles(out + 6, q);
    }
  } else if constexpr (Q == 2 || Q == 4) {
    float hi, lo;
    gemma_kv_max_min(x, hi, lo);
    const float d = __fdiv_rn(__fsub_rn(hi, lo), Q == 2 ? 15.0f : 31.0f);
    const float id = gemma_kv_inverse(d);
    for (int j = 0; j < 32; ++j) q[j] = gemma_kv_level_from_min(x[j], lo, id, Q == 2 ? 15 : 31);
    gemma_kv_put_f16(out, d);
    gemma_kv_put_f16(out + 2, lo);
    if constexpr (Q == 2) {
      gemma_kv_put_nibbles(out + 4, q);
    } else {
      gemma_kv_put_high_bits(out + 4, q);
      gemma_kv_put_nibbles(out + 8, q);
    }
  } else {
    const float max = gemma_kv_signed_max(x);
    float d = 0.0f;
    for (int j = 0; j < 32; ++j) q[j] = 0;
    if (fabsf(max) >= 1e-15f) {
      const float id = __fdiv_rn(1.0f, __fdiv_rn(max, static_cast<float>(GEMMA_IQ4_NL_LEVELS[0])));
      float sumqx = 0.0f, sumq2 = 0.0f;
      for (int j = 0; j < 32; ++j) {
        q[j] = gemma_kv_nearest_iq4_nl(__fmul_rn(id, x[j]));
        const float level = static_cast<float>(GEMMA_IQ4_NL_LEVELS[q[j]]);
        const float w = __fmul_rn(x[j], x[j]);
        sumqx = __fadd_rn(sumqx, __fmul_rn(__fmul_rn(w, level), x[j]));
        sumq2 = __fadd_rn(sumq2, __fmul_rn(__fmul_rn(w, level), level));
      }
      if (sumq2 > 0.0f) d = __fdiv_rn(sumqx, sumq2);
    }
    gemma_kv_put_f16(out, d);
    gemma_kv_put_nibbles(out + 2, q);
  }
}

// Nibble j (0-31) of the 16 bytes at `b`: low nibbles are values 0-15.
__device__ __forceinline__ int gemma_kv_nibble(const unsigned char* b, int j) {
  return (b[j & 15] >> (4 * (j >> 4))) & 15;
}

// Bit j of the little-endian u32 at `b`, as 16 or 0.
__device__ __forceinline__ int gemma_kv_fifth(const unsigned char* b, int j) {
  return ((b[j >> 3] >> (j & 7)) & 1) << 4;
}

// Value j of the block at `b`.
template <int Q>
__device__ __forceinline__ float gemma_kv_value(const unsigned char* b, int j) {
  const float d = gemma_kv_f16_at(b);
  if constexpr (Q == 0) {
    return __fmul_rn(d, static_cast<float>(static_cast<signed char>(b[2 + j])));
  } else if constexpr (Q == 1) {
    return __fmul_rn(d, static_cast<float>(gemma_kv_nibble(b + 2, j) - 8));
  } else if constexpr (Q == 2) {
    return __fadd_rn(__fmul_rn(d, static_cast<float>(gemma_kv_nibble(b + 4, j))), gemma_kv_f16_at(b + 2));
  } else if constexpr (Q == 3) {
    return __fmul_rn(d, static_cast<float>((gemma_kv_nibble(b + 6, j) | gemma_kv_fifth(b + 2, j)) - 16));
  } else if constexpr (Q == 4) {
    const int level = gemma_kv_nibble(b + 8, j) | gemma_kv_fifth(b + 4, j);
    return __fadd_rn(__fmul_rn(d, static_cast<float>(level)), gemma_kv_f16_at(b + 2));
  } else {
    return __fmul_rn(d, static_cast<float>(GEMMA_IQ4_NL_LEVELS[gemma_kv_nibble(b + 2, j)]));
  }
}

template <int Q>
__device__ __forceinline__ void gemma_kv_dequantize(const unsigned char* b, float y[32]) {
  for (int j = 0; j < 32; ++j) y[j] = gemma_kv_value<Q>(b, j);
}
"#;
