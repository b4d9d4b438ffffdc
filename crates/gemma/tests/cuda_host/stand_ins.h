// Host stand-ins for the CUDA types and intrinsics that the weight-row
// device functions use, with CUDA's semantics (fmaf is fused on both).
#include <cmath>
#include <math.h>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define __device__
#define __forceinline__ inline

struct uint4 { unsigned int x, y, z, w; };
struct uint2 { unsigned int x, y; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }

struct __half { unsigned short bits; };
struct __nv_bfloat16 {
  unsigned short bits;
  explicit operator float() const {
    const unsigned int wide = static_cast<unsigned int>(bits) << 16;
    float f;
    std::memcpy(&f, &wide, 4);
    return f;
  }
};
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

inline unsigned short __half_as_ushort(__half h) { return h.bits; }
// Round to nearest even, as the GPU's conversion (finite values within
// float16's range and its subnormals).
inline __half __float2half_rn(float f) {
  const unsigned short sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a == 0.0) return __half{sign};
  int e;
  std::frexp(a, &e);  // a = m·2^e, m in [0.5, 1)
  // The float16 spacing at a: 2^(e − 11) for normal values, 2^−24 below 2^−14.
  const int step = e - 11 < -24 ? -24 : e - 11;
  const double units = std::nearbyint(std::ldexp(a, -step));  // the default mode rounds to even
  const double rounded = std::ldexp(units, step);
  if (rounded >= 65520.0) return __half{static_cast<unsigned short>(sign | 0x7C00)};
  int re;
  const double m = std::frexp(rounded, &re);
  if (re - 1 < -14) return __half{static_cast<unsigned short>(sign | static_cast<unsigned short>(units))};
  const unsigned short exponent = static_cast<unsigned short>(re - 1 + 15);
  const unsigned short mantissa = static_cast<unsigned short>(std::ldexp(m, 11) - 1024.0);
  return __half{static_cast<unsigned short>(sign | (exponent << 10) | mantissa)};
}

// A warp of the host: 32 threads (lanes) that meet at every tensor-core
// step. `gemma_host_lane` is the calling thread's lane.
#include <condition_variable>
#include <mutex>
struct gemma_host_warp {
  std::mutex mutex;
  std::condition_variable turn;
  int waiting = 0;
  unsigned long long round = 0;
  unsigned int a[32][4];
  unsigned int b[32][2];
  // Every lane's wait for the other 31.
  void meet() {
    std::unique_lock<std::mutex> lock(mutex);
    const unsigned long long mine = round;
    if (++waiting == 32) {
      waiting = 0;
      ++round;
      turn.notify_all();
    } else {
      turn.wait(lock, [&] { return round != mine; });
    }
  }
};
inline thread_local gemma_host_warp* gemma_host_this_warp = nullptr;
inline thread_local int gemma_host_lane = 0;

// PTX's mma.m16n8k16 (float16 operands, float32 sums) over the warp's
// fragments: A element (row m, column k) in lane 4·(m % 8) + (k % 8) / 2,
// register (m / 8) + 2·(k / 8), half k % 2; B element (k, n) in lane 4n +
// (k % 8) / 2, register k / 8, half k % 2; this lane's sums D(g, 2t),
// D(g, 2t + 1), D(g + 8, 2t), D(g + 8, 2t + 1). Products are exact and each
// sum is taken in double, then rounded to float once.
inline void gemma_mma_f16(float (&c)[4], const unsigned int (&a)[4], const unsigned int (&b)[2]) {
  gemma_host_warp& w = *gemma_host_this_warp;
  const int lane = gemma_host_lane;
  for (int i = 0; i < 4; ++i) w.a[lane][i] = a[i];
  for (int i = 0; i < 2; ++i) w.b[lane][i] = b[i];
  w.meet();
  auto half = [](unsigned int reg, int k) {
    return static_cast<double>(__half2float(__half{static_cast<unsigned short>(reg >> (16 * (k & 1)))}));
  };
  const int g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; ++i) {
    const int m = g + 8 * (i >> 1), n = 2 * t + (i & 1);
    double s = c[i];
    for (int k = 0; k < 16; ++k) {
      const double av = half(w.a[4 * (m % 8) + (k % 8) / 2][(m / 8) + 2 * (k / 8)], k);
      const double bv = half(w.b[4 * n + (k % 8) / 2][k / 8], k);
      s += av * bv;
    }
    c[i] = static_cast<float>(s);
  }
  w.meet();
}

// Stops the program where `p` is not aligned to `n` bytes: the GPU's loads
// of n bytes fault on such addresses, which the host would read silently.
inline void gemma_host_aligned(const void* p, size_t n) {
  if (reinterpret_cast<uintptr_t>(p) % n != 0) {
    std::fprintf(stderr, "misaligned access: %p is not aligned to %zu bytes\n", p, n);
    std::abort();
  }
}

// A load through the read-only cache (aligned to its size, as on the GPU).
template <typename T> inline T __ldg(const T* p) {
  gemma_host_aligned(p, sizeof(T));
  return *p;
}

// A block's barrier: the host runs no block-wide code, only compiles it.
inline void __syncthreads() {}
// The thread's place in its block, for block-wide code the host compiles.
struct gemma_host_dim3 { unsigned int x, y, z; };
inline gemma_host_dim3 threadIdx{0, 0, 0};
inline gemma_host_dim3 blockDim{32, 1, 1};
