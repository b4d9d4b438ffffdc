"""The GPU's read bandwidth, measured three ways on the same build of MLX, for
the weight-bandwidth bound of decoding: MLX's `sum` over 2 GiB of float32,
MLX's matrix-vector product over a 2 GiB bfloat16 matrix (the operation
decoding is made of), and a kernel of 16-byte loads over 4 GiB (through
`mx.fast.cuda_kernel`). Prints one line per way and the highest, which is
the bound to compare against. Run after the setup script has written
/tmp/site/env.sh.
"""
import time

import mlx.core as mx

READ = """
  const uint4* p = reinterpret_cast<const uint4*>(a);
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  unsigned int acc = 0;
  #pragma unroll 4
  for (size_t i = first; i < static_cast<size_t>(N); i += stride) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  out[first] = acc;
"""


def rate(nbytes, run, calls=10):
    """Bytes per second of `run` (which returns an array to evaluate), after
    three warm-up calls, over `calls` calls queued together."""
    for _ in range(3):
        mx.eval(run())
    start = time.perf_counter()
    mx.eval([run() for _ in range(calls)])
    return nbytes * calls / (time.perf_counter() - start)


def main():
    floats = mx.ones((1 << 29,), dtype=mx.float32)
    matrix = mx.ones((32768, 32768), dtype=mx.bfloat16)
    vector = mx.ones((1, 32768), dtype=mx.bfloat16)
    words = mx.ones((1 << 30,), dtype=mx.uint32)
    mx.eval(floats, matrix, vector, words)
    kernel = mx.fast.cuda_kernel(name="read_bandwidth", input_names=["a"], output_names=["out"], source=READ)
    threads, blocks = 512, 132 * 8
    vectors = words.nbytes // 16

    def loads():
        return kernel(inputs=[words], template=[("N", vectors)], grid=(threads * blocks, 1, 1),
                      threadgroup=(threads, 1, 1), output_shapes=[(threads * blocks,)],
                      output_dtypes=[mx.uint32])[0]

    rates = {
        "sum over 2 GiB float32": rate(floats.nbytes, lambda: mx.sum(floats)),
        "MLX matrix-vector product, 2 GiB bfloat16": rate(matrix.nbytes, lambda: vector @ matrix.T),
        "16-byte loads over 4 GiB": rate(words.nbytes, loads),
    }
    for name, r in rates.items():
        print(f"read bandwidth ({name}): {r / 1e12:.2f} TB/s")
    print(f"read bandwidth, highest: {max(rates.values()) / 1e12:.2f} TB/s")


if __name__ == "__main__":
    main()
