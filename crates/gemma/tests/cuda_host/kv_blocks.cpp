// Quantizes rows of floats into one of ggml's KV block formats with the GPU
// cache's device functions, then decodes the blocks again.
// Usage: kv_blocks TYPE BLOCKS VALUES_FILE BLOCKS_OUT VALUES_OUT (TYPE as
// the `Q` template argument; files of little-endian f32 and bytes).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "stand_ins.h"
#include "kv_blocks.cuh"

template <int Q>
void round_trip(int blocks, const float* x, std::FILE* bytes_out, std::FILE* values_out) {
  std::vector<unsigned char> block(gemma_kv_type<Q>::BYTES);
  float y[32];
  for (int b = 0; b < blocks; ++b) {
    gemma_kv_quantize<Q>(x + 32 * b, block.data());
    std::fwrite(block.data(), 1, block.size(), bytes_out);
    gemma_kv_dequantize<Q>(block.data(), y);
    std::fwrite(y, 4, 32, values_out);
  }
}

int main(int argc, char** argv) {
  if (argc != 6) { std::fprintf(stderr, "usage: kv_blocks TYPE BLOCKS VALUES BLOCKS_OUT VALUES_OUT\n"); return 2; }
  const int type = std::atoi(argv[1]), blocks = std::atoi(argv[2]);
  std::vector<float> x(static_cast<size_t>(blocks) * 32);
  std::FILE* in = std::fopen(argv[3], "rb");
  if (!in || std::fread(x.data(), 4, x.size(), in) != x.size()) { std::perror(argv[3]); return 2; }
  std::fclose(in);
  std::FILE* bytes_out = std::fopen(argv[4], "wb");
  std::FILE* values_out = std::fopen(argv[5], "wb");
  if (!bytes_out || !values_out) { std::perror("output"); return 2; }
  switch (type) {
    case 0: round_trip<0>(blocks, x.data(), bytes_out, values_out); break;
    case 1: round_trip<1>(blocks, x.data(), bytes_out, values_out); break;
    case 2: round_trip<2>(blocks, x.data(), bytes_out, values_out); break;
    case 3: round_trip<3>(blocks, x.data(), bytes_out, values_out); break;
    case 4: round_trip<4>(blocks, x.data(), bytes_out, values_out); break;
    case 5: round_trip<5>(blocks, x.data(), bytes_out, values_out); break;
    default: std::fprintf(stderr, "type %d\n", type); return 2;
  }
  std::fclose(bytes_out);
  std::fclose(values_out);
  return 0;
}
