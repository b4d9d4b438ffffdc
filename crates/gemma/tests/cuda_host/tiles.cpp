// Multiplies rows of ggml blocks or MLX affine rows by a row of bfloat16
// activations as the layer kernel's tensor-core path does: the activations
// made float16 operands (gemma_mma_put4, one power-of-two scale, sums of
// each 16), then every tile of 16 rows by a warp of 32 host threads
// (gemma_mma_tile), its units dealt to SLICES warps whose sums are added in
// order.
// Usage: tiles FORMAT ROWS K ROWS_FILE X_FILE SLICES [BITS GROUP SCALES
// BIASES TYPE] (the five for affine rows, format 7: scales and biases as
// float files, entering as TYPE, `bf16` or `f32`; bfloat16 ones must be
// bfloat16 values) > one product per line. Fails (status 3) where the lanes
// of a group disagree.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "driver_files.h"
#include "stand_ins.h"
#include "tiles.cuh"

// Every lane's two sums of tile `tile` over the units of `slice`.
template <int WF, int WB, int WG, typename S>
static void run_warp(const uint8_t* w, const S* scales, const S* biases, int tile, int k, int slice, int slices,
                     const unsigned short* xh, const float* xsum, float (&sums)[32][2]) {
  gemma_host_warp warp;
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < 32; ++lane) {
    lanes.emplace_back([&, lane] {
      gemma_host_this_warp = &warp;
      gemma_host_lane = lane;
      float acc[2] = {0.0f, 0.0f};
      gemma_mma_tile<WF, WB, WG>(w, scales, biases, static_cast<size_t>(16 * tile), k, slice, slices, xh, xsum, lane,
                                 acc);
      sums[lane][0] = acc[0];
      sums[lane][1] = acc[1];
    });
  }
  for (std::thread& t : lanes) t.join();
}

template <int WF, int WB = 1, int WG = 1, typename S = float>
static int products(const uint8_t* w, int rows, int k, std::vector<__nv_bfloat16>& xs, int slices,
                    const S* scales = nullptr, const S* biases = nullptr) {
  // The block's conversion (gemma_mma_activations), one thread after another.
  float m = 0.0f;
  for (int i = 0; i < k; ++i) m = std::fmax(m, std::fabs(static_cast<float>(xs[i])));
  const int e = gemma_mma_exponent(m);
  std::vector<float> four(k / 4), xsum(k / 16);
  for (int q = 0; q < k / 4; ++q) four[q] = gemma_mma_put4(xs.data(), q, gemma_pow2(e));
  for (int i = 0; i < k / 16; ++i) xsum[i] = (four[4 * i] + four[4 * i + 1]) + (four[4 * i + 2] + four[4 * i + 3]);
  const unsigned short* xh = reinterpret_cast<const unsigned short*>(xs.data());
  for (int tile = 0; tile < rows / 16; ++tile) {
    float total[16] = {};
    for (int slice = 0; slice < slices; ++slice) {
      float sums[32][2];
      run_warp<WF, WB, WG>(w, scales, biases, tile, k, slice, slices, xh, xsum.data(), sums);
      for (int lane = 0; lane < 32; ++lane) {
        if (sums[lane][0] != sums[lane & ~3][0] || sums[lane][1] != sums[lane & ~3][1]) {
          std::fprintf(stderr, "tile %d: lane %d's sums differ from its group's first lane\n", tile, lane);
          return 3;
        }
      }
      for (int g = 0; g < 8; ++g) {
        total[g] += sums[4 * g][0];
        total[g + 8] += sums[4 * g][1];
      }
    }
    for (int r = 0; r < 16; ++r) std::printf("%.17g\n", static_cast<double>(total[r] * gemma_pow2(-e)));
  }
  return 0;
}

// The floats of file `path` as S (bfloat16 ones must be bfloat16 values).
template <typename S>
static std::vector<S> read_as(const char* path) {
  const std::vector<unsigned char> b = read_all(path, 0);
  std::vector<S> out(b.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    unsigned int bits;
    std::memcpy(&bits, b.data() + 4 * i, 4);
    if constexpr (std::is_same_v<S, __nv_bfloat16>) {
      if (bits & 0xFFFFu) { std::fprintf(stderr, "%s: value %zu is not a bfloat16 value\n", path, i); std::exit(2); }
      out[i].bits = static_cast<unsigned short>(bits >> 16);
    } else {
      std::memcpy(&out[i], &bits, 4);
    }
  }
  return out;
}

// The products of affine rows (argv as main's, the affine arguments at 7-10)
// with scales and biases of S.
template <int WB, typename S>
static int affine(const uint8_t* w, int rows, int k, std::vector<__nv_bfloat16>& xs, int slices, char** argv) {
  const int group = std::atoi(argv[8]);
  const std::vector<S> scales = read_as<S>(argv[9]), biases = read_as<S>(argv[10]);
  if (k % group != 0 || scales.size() != static_cast<size_t>(rows) * (k / group) || biases.size() != scales.size()) {
    std::fprintf(stderr, "%d rows of %d values in groups of %d need as many scales and biases\n", rows, k, group);
    return 2;
  }
  switch (group) {
    case 32: return products<7, WB, 32>(w, rows, k, xs, slices, scales.data(), biases.data());
    case 64: return products<7, WB, 64>(w, rows, k, xs, slices, scales.data(), biases.data());
    case 128: return products<7, WB, 128>(w, rows, k, xs, slices, scales.data(), biases.data());
    default: std::fprintf(stderr, "group %d\n", group); return 2;
  }
}

// `affine` for the bits of argv[7].
template <typename S>
static int affine_bits(const uint8_t* w, int rows, int k, std::vector<__nv_bfloat16>& xs, int slices, char** argv) {
  switch (std::atoi(argv[7])) {
    case 4: return affine<4, S>(w, rows, k, xs, slices, argv);
    case 8: return affine<8, S>(w, rows, k, xs, slices, argv);
    default: std::fprintf(stderr, "bits %s\n", argv[7]); return 2;
  }
}

int main(int argc, char** argv) {
  if (argc != 7 && argc != 12) {
    std::fprintf(stderr, "usage: tiles FORMAT ROWS K ROWS_FILE X_FILE SLICES [BITS GROUP SCALES BIASES TYPE]\n");
    return 2;
  }
  const int format = std::atoi(argv[1]), rows = std::atoi(argv[2]), k = std::atoi(argv[3]);
  const int slices = std::atoi(argv[6]);
  if (rows % 16 != 0 || k % 32 != 0 || slices < 1) {
    std::fprintf(stderr, "rows must be a multiple of 16, K of 32, slices at least 1\n");
    return 2;
  }
  // The rows start 16-byte aligned, as the GPU's buffers do.
  const std::vector<unsigned char> raw = read_all(argv[4], 0);
  std::vector<unsigned char> storage(raw.size() + 16);
  uint8_t* w = storage.data();
  while (reinterpret_cast<size_t>(w) % 16) ++w;
  std::memcpy(w, raw.data(), raw.size());
  std::vector<__nv_bfloat16> xs = read_as<__nv_bfloat16>(argv[5]);
  if (xs.size() != static_cast<size_t>(k)) {
    std::fprintf(stderr, "%s: %zu activations for rows of %d values\n", argv[5], xs.size(), k);
    return 2;
  }
  xs.resize(k + 8);
  switch (format) {
    case 1: return products<1>(w, rows, k, xs, slices);
    case 2: return products<2>(w, rows, k, xs, slices);
    case 3: return products<3>(w, rows, k, xs, slices);
    case 4: return products<4>(w, rows, k, xs, slices);
    case 5: return products<5>(w, rows, k, xs, slices);
    case 6: return products<6>(w, rows, k, xs, slices);
    case 7:
      if (argc != 12) { std::fprintf(stderr, "affine rows need BITS GROUP SCALES BIASES TYPE\n"); return 2; }
      if (std::strcmp(argv[11], "bf16") == 0) return affine_bits<__nv_bfloat16>(w, rows, k, xs, slices, argv);
      if (std::strcmp(argv[11], "f32") == 0) return affine_bits<float>(w, rows, k, xs, slices, argv);
      std::fprintf(stderr, "scale type %s\n", argv[11]);
      return 2;
    default: std::fprintf(stderr, "format %d has no tensor-core reader\n", format); return 2;
  }
}
