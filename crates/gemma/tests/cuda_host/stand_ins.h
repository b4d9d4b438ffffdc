// Host stand-ins for the CUDA types and intrinsics that the weight-row
// device functions use, with CUDA's semantics (fmaf is fused on both).
#include <cmath>
#include <math.h>
#include <cstddef>
#include <cstdint>
#include <cstring>

#define __device__
#define __forceinline__ inline

struct uint4 { unsigned int x, y, z, w; };
struct uint2 { unsigned int x, y; };
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }

struct __half { unsigned short bits; };
struct __nv_bfloat16 { unsigned short bits; };
inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline float __half2float(__half h) {
  const unsigned int sign = h.bits >> 15, exponent = (h.bits >> 10) & 31, mantissa = h.bits & 1023;
  float v;
  if (exponent == 0) v = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31) v = mantissa ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(mantissa | 1024), static_cast<int>(exponent) - 25);
  return sign ? -v : v;
}

// Byte n of the result is byte (s >> 4n) & 7 of the 8 bytes y:x.
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
  unsigned char b[8];
  std::memcpy(b, &x, 4);
  std::memcpy(b + 4, &y, 4);
  unsigned int r = 0;
  for (int n = 0; n < 4; ++n) r |= static_cast<unsigned int>(b[(s >> (4 * n)) & 7]) << (8 * n);
  return r;
}
inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return static_cast<unsigned int>(v >> (shift & 31));
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
// One lane stands for the warp: the driver sums the lanes itself.
inline float __shfl_xor_sync(unsigned int, float v, int) { return v; }

inline unsigned int __float_as_uint(float f) { unsigned int i; std::memcpy(&i, &f, 4); return i; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline float __double2float_rn(double d) { return static_cast<float>(d); }
