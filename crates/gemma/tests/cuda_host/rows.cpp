// Multiplies rows of weights in one of the GPU kernels' formats by a row of
// float activations as a warp of the kernels does (the 32 lanes' shares of
// gemma_wdot_lane, summed in double here).
// Usage: driver FORMAT ROWS K ROWS_FILE X_FILE [BITS GROUP SCALES BIASES] [bf16]
// (the four for MLX affine rows, format 7, with float scales and biases;
// `bf16`: the activations, which must be bfloat16 values, enter as
// bfloat16, as the GPU's do) > one product per line.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "driver_files.h"
#include "stand_ins.h"
#include "rows.cuh"

template <int WF, int WB = 1, int WG = 1, typename U>
void products(const uint8_t* w, int rows, int k, const U* x, const float* scales = nullptr,
              const float* biases = nullptr) {
  for (int r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int lane = 0; lane < 32; ++lane) {
      sum += gemma_wdot_lane<WF, WB, WG, float, U>(w, scales, biases, static_cast<size_t>(r), k, x, lane);
    }
    std::printf("%.17g\n", sum);
  }
}

static std::vector<float> read_floats(const char* path) {
  std::vector<unsigned char> b = read_all(path, 0);
  std::vector<float> out(b.size() / 4);
  std::memcpy(out.data(), b.data(), out.size() * 4);
  return out;
}

template <int WB, typename U>
void affine(const uint8_t* w, int rows, int k, const U* x, int group, const float* scales, const float* biases) {
  switch (group) {
    case 32: products<7, WB, 32>(w, rows, k, x, scales, biases); break;
    case 64: products<7, WB, 64>(w, rows, k, x, scales, biases); break;
    case 128: products<7, WB, 128>(w, rows, k, x, scales, biases); break;
    default: std::fprintf(stderr, "group %d\n", group); std::exit(2);
  }
}

// The products of rows in `format` (argv as main's, the affine arguments at
// 6-9) with activations `x`.
template <typename U>
int run(int format, const uint8_t* w, int rows, int k, const U* x, bool has_affine, char** argv) {
  switch (format) {
    case 1: products<1>(w, rows, k, x); break;
    case 2: products<2>(w, rows, k, x); break;
    case 3: products<3>(w, rows, k, x); break;
    case 4: products<4>(w, rows, k, x); break;
    case 5: products<5>(w, rows, k, x); break;
    case 6: products<6>(w, rows, k, x); break;
    case 7: {
      if (!has_affine) { std::fprintf(stderr, "affine rows need BITS GROUP SCALES BIASES\n"); return 2; }
      const int bits = std::atoi(argv[6]), group = std::atoi(argv[7]);
      std::vector<float> scales = read_floats(argv[8]), biases = read_floats(argv[9]);
      if (bits == 4) affine<4>(w, rows, k, x, group, scales.data(), biases.data());
      else if (bits == 8) affine<8>(w, rows, k, x, group, scales.data(), biases.data());
      else { std::fprintf(stderr, "bits %d\n", bits); return 2; }
      break;
    }
    default: std::fprintf(stderr, "format %d\n", format); return 2;
  }
  return 0;
}

int main(int argc, char** argv) {
  const bool bf16 = argc > 1 && std::strcmp(argv[argc - 1], "bf16") == 0;
  const int args = bf16 ? argc - 1 : argc;
  if (args != 6 && args != 10) {
    std::fprintf(stderr, "usage: driver FORMAT ROWS K ROWS_FILE X [BITS GROUP SCALES BIASES] [bf16]\n");
    return 2;
  }
  const int format = std::atoi(argv[1]), rows = std::atoi(argv[2]), k = std::atoi(argv[3]);
  // The rows start 16-byte aligned, as the GPU's buffers do.
  std::vector<unsigned char> raw = read_all(argv[4], 16);
  std::vector<unsigned char> aligned(raw.size() + 16);
  uint8_t* w = aligned.data();
  while (reinterpret_cast<size_t>(w) % 16) ++w;
  std::memcpy(w, raw.data(), raw.size() - 16);
  std::vector<float> x = read_floats(argv[5]);
  if (!bf16) return run(format, w, rows, k, x.data(), args == 10, argv);
  // The activations' top 16 bits, 16-byte aligned as the kernels' shared
  // memory is.
  std::vector<__nv_bfloat16> storage(x.size() + 8);
  __nv_bfloat16* xb = storage.data();
  while (reinterpret_cast<size_t>(xb) % 16) ++xb;
  for (size_t i = 0; i < x.size(); ++i) {
    unsigned int bits;
    std::memcpy(&bits, &x[i], 4);
    if (bits & 0xFFFFu) { std::fprintf(stderr, "activation %zu is not a bfloat16 value\n", i); return 2; }
    xb[i].bits = static_cast<unsigned short>(bits >> 16);
  }
  return run(format, w, rows, k, xb, args == 10, argv);
}
