"""Where the fused decode layer's time goes, phase by phase, on the GPU machine.

Takes `gemma::kernels::decode_layer`'s CUDA source as the crate compiles it
(the JSON that `cargo run --release -p gemma --example decode_layer_source`
prints, made on the build machine), adds `clock64` stamps per block around
its phases and barriers, runs it through `mx.fast.cuda_kernel` on random
bfloat16 weights of one layer of the given Gemma 3 sizes with a bfloat16 KV
cache (30 calls chained as in a decode step; a sliding-window layer with a
full window, then a global one at 2300 keys), and prints medians and maxima
over blocks and calls, in µs at 1.98 GHz. Run after the setup script has
written /tmp/site/env.sh, from the project root.

Weights are bfloat16, or GGUF blocks of random codes (scales small and
finite) read as stored, the K-quants on the tensor cores as the crate
chooses from a hidden size of 2048: `q4k` every projection Q4_K, `q4k6` the
value and down projections Q6_K (the layers llama-quantize's Q4_K_M gives
more bits), `q8` every projection Q8_0 (scalar readers).

Usage: python3 xtask/gpu/layer_phases.py SOURCE.json [small|wide] [SIZE[:WEIGHTS] ...]
  SIZE: 270m, 1b, 4b, 12b or 27b; WEIGHTS: bf16 (the default), q4k, q4k6, q8;
  small: position, write slot and valid count as 4-byte arrays (MLX keeps
         arrays of 8 bytes or less in a managed pool advised read-mostly);
  wide:  the same values in 16-byte arrays (the default).
Sizes default to 270m.
"""
import json
import statistics
import sys

import mlx.core as mx
import numpy as np

SOURCE = json.load(open(sys.argv[1]))
INPUTS = SOURCE["inputs"]
STAMPS = 20
GHZ = 1.98
BLOCKS = 132


def stamped_body():
    """The kernel body with stamps: 0 at the start, 2k+1 / 2k+2 around
    barrier k, 11 at the end, 12–16 inside the first two phases."""
    body = SOURCE["body"]

    def insert(anchor, text, after=True):
        i = body.index(anchor)
        j = i + len(anchor) if after else i
        return body[:j] + text + body[j:]

    body = insert("const float inv = rsqrtf(gemma_block_sum(ss, red) / H + EPS);", " STAMP(12);")
    body = insert("    if constexpr (gemma_mma_on(MMA, WQF)", "    STAMP(13);\n", after=False)
    # After the tensor-core readers' activations of Q/K/V, gate/up and down.
    act = "      const float down = gemma_mma_activations("
    at = [i for i in range(len(body)) if body.startswith(act, i)]
    assert len(at) == 4, "the kernel no longer converts activations in four phases"
    for k, i in zip((19, 18, 17), (at[3], at[2], at[0])):
        j = body.index("\n", i) + 1
        body = body[:j] + f"      STAMP({k});\n" + body[j:]
    body = insert("      const int chunk = (n + S - 1) / S;", "      STAMP(14);\n", after=False)
    body = insert("      // The warps' partial outputs, one query head at a time.", "      STAMP(15);\n", after=False)
    body = insert("      if (last_split) {", "      STAMP(16);\n", after=False)
    parts = body.split("  gemma_grid_sync(bar, G);")
    assert len(parts) == 6, "the kernel no longer has five grid barriers"
    out = "  STAMP(0);\n" + parts[0]
    for k in range(5):
        out += f"  STAMP({2 * k + 1}); gemma_grid_sync(bar, G); STAMP({2 * k + 2});" + parts[k + 1]
    return out + "  STAMP(11);\n"


def query_heads_per_block(heads, kv_heads, dim):
    """As `decode_layer` chooses: the most query heads of a key/value head
    (a divisor of their count) with at most eight features a lane."""
    shared = heads // kv_heads
    return max(q for q in range(1, shared + 1) if shared % q == 0 and (q * (dim // 32) <= 8 or q == 1))


# ggml block types as the kernel numbers them: (format, values, bytes, byte
# offsets of the block's float16 scales).
BLOCKS_OF = {"q8": (3, 32, 34, (0,)), "q4k": (4, 256, 144, (0, 2)), "q6k": (6, 256, 210, (208,))}
RNG = np.random.default_rng(0)


def gguf_rows(kind, rows, cols):
    """Random blocks of `kind` for a rows × cols matrix, flat uint8, their
    float16 scales 1e-3."""
    f, values, size, scales = BLOCKS_OF[kind]
    data = RNG.integers(0, 256, (rows * cols // values, size), dtype=np.uint8)
    for at in scales:
        data[:, at:at + 2] = np.array([1e-3], dtype=np.float16).view(np.uint8)
    return mx.array(data.reshape(-1))


def part_kinds(weights):
    """Each projection's weights (q, k, v, o, gate, up, down) for a spec."""
    if weights == "q4k6":
        return ["q4k", "q4k", "q6k", "q4k", "q4k", "q4k", "q6k"]
    return [weights] * 7


def run(tag, scalars, weights, hidden, inter, heads, kv_heads, dim, capacity, valid):
    dt = mx.bfloat16

    def r(*shape):
        return (mx.random.normal(shape) * 0.05).astype(dt)

    width = 4 if scalars == "wide" else 1
    def scalar(v):
        return mx.array([v] * width, dtype=mx.int32)

    unused = mx.zeros((1,), dt)
    # The inputs in SOURCE["inputs"] order: dense bfloat16 projections (a
    # fused matrix handed in as each of its parts, the unused scale and bias
    # inputs of that format beside each), the KV cache as float data with
    # the unused scale and bias inputs of that format.
    u = [unused, unused]
    if weights == "bf16":
        qkv, gate_up = r((heads + 2 * kv_heads) * dim, hidden), r(2 * inter, hidden)
        parts = [qkv, qkv, qkv, r(hidden, heads * dim), gate_up, gate_up, r(hidden, inter)]
        formats = [0] * 7
        offsets = [0, heads * dim, (heads + kv_heads) * dim, 0, inter]
    else:
        shapes = [(heads * dim, hidden), (kv_heads * dim, hidden), (kv_heads * dim, hidden), (hidden, heads * dim),
                  (inter, hidden), (inter, hidden), (hidden, inter)]
        kinds = part_kinds(weights)
        parts = [gguf_rows(k, n, c) for k, (n, c) in zip(kinds, shapes)]
        formats = [BLOCKS_OF[k][0] for k in kinds]
        offsets = [0] * 5
    q, k, v, o, gate, up, down = parts
    w = [r(1, 1, hidden), r(hidden) + 1, q, *u, k, *u, v, *u, r(dim) + 1, r(dim) + 1,
         o, *u, r(hidden) + 1, r(hidden) + 1, gate, *u, up, *u,
         down, *u, r(hidden) + 1,
         scalar(valid - 1), scalar(valid - 1), scalar(valid),
         r(1, kv_heads, capacity, dim), unused, unused,
         r(1, kv_heads, capacity, dim), unused, unused]
    mx.eval(w)
    smem = (max(max(hidden, inter, heads * dim) * 2, 16 * dim * 4) + 15) // 16 * 16
    consts = ("  constexpr float EPS = 1e-6f;\n  constexpr float SCALE = 0.0625f;\n"
              "  constexpr float LOG2_BASE = 13.2877f;\n  constexpr float ROPE_SCALE = 1.0f;\n")
    stamp = f"#define STAMP(k) if (threadIdx.x == 0) {{ times[blockIdx.x * {STAMPS} + (k)] = clock64(); }}\n"
    # The crate declares the kernel `__launch_bounds__(512)` (the compiler
    # keeps 512 threads' registers within a multiprocessor's); MLX's Python
    # kernels carry no bound, so it is added to the kernel MLX declares.
    bound = "#undef __global__\n#define __global__ __location__(global) __launch_bounds__(512)\n"
    # Dynamic shared memory past MLX's 48,000 at every size, so that the
    # kernel's limit is raised whatever its static arrays take (the crate
    # asks for that only where a block passes 48 KiB in all: 27B).
    kernel = mx.fast.cuda_kernel(
        name=f"layer_phases_{scalars}_{tag}", input_names=INPUTS,
        output_names=["out", "scratch", "partials", "times"], source=consts + stamped_body(),
        header=stamp + SOURCE["header"] + bound, shared_memory=max(smem, 48001))
    # The K-quants on the tensor cores from a hidden size of 2048, as
    # `mma_rows::tensor_core_formats` chooses by default.
    mma = 0b1110000 if hidden >= 2048 else 0
    barrier = mx.zeros((160,), mx.int32)
    qb = query_heads_per_block(heads, kv_heads, dim)
    splits = BLOCKS // (heads // qb)

    def call(x):
        return kernel(
            inputs=[x] + w[1:] + [barrier],
            template=[("T", dt), ("D", dim), ("HQ", heads), ("HKV", kv_heads), ("QB", qb), ("PAIR", 1),
                      ("WARPS", 16), ("SMEM", smem), ("MMA", mma), ("KF", 0), ("KB", 0), ("KG", 0),
                      ("VF", 0), ("VB", 0), ("VG", 0), ("INTER", inter)]
            + [(f"W{p}{t}", f if t == "F" else 1) for p, f in zip("QKVOGUD", formats) for t in "FBG"]
            + list(zip(["WQO", "WKO", "WVO", "WGO", "WUO"], offsets)),
            grid=(BLOCKS * 512, 1, 1), threadgroup=(512, 1, 1),
            output_shapes=[(1, 1, hidden), ((heads + 2 * kv_heads) * dim + 2 * heads * dim + 3 * hidden + inter,),
                           (heads * splits * (dim + 2),), (BLOCKS * STAMPS,)],
            output_dtypes=[dt, dt, mx.float32, mx.int64], init_value=0)

    x = w[0]
    mx.eval(call(x))
    times = []
    for _ in range(30):
        out = call(x)
        x = out[0]
        times.append(out[3])
    mx.eval(times)
    rows = [t.tolist() for t in times[10:]]

    def span(a, b, label):
        d = [t[g * STAMPS + b] - t[g * STAMPS + a] for t in rows for g in range(BLOCKS)
             if t[g * STAMPS + a] and t[g * STAMPS + b]]
        if not d:
            return f"{label} -"
        return f"{label} {statistics.median(d) / GHZ / 1000:.1f} (max {max(d) / GHZ / 1000:.1f})"

    phases = [span(0, 12, "start+norm"), span(13, 17, "QKV act"), span(13, 1, "QKV"), span(1, 2, "barrier 1"),
              span(2, 14, "q/k norm+RoPE"), span(14, 15, "keys"), span(15, 16, "split merge"),
              span(16, 3, "head merge"), span(3, 4, "barrier 2"), span(4, 5, "o_proj"),
              span(6, 18, "norms+act"), span(6, 7, "norms+gate/up"), span(8, 19, "down act"), span(8, 9, "down"),
              span(10, 11, "residual"),
              span(0, 11, "total")]
    print(f"{scalars} {tag}: " + " | ".join(phases), flush=True)


# hidden, intermediate, query heads, key/value heads, head dim, sliding window
SHAPES = {
    "270m": (640, 2048, 4, 1, 256, 512),
    "1b": (1152, 6912, 4, 1, 256, 512),
    "4b": (2560, 10240, 8, 4, 256, 1024),
    "12b": (3840, 15360, 16, 8, 256, 1024),
    "27b": (5376, 21504, 32, 16, 128, 1024),
}

scalars = sys.argv[2] if len(sys.argv) > 2 else "wide"
for spec in sys.argv[3:] or ["270m"]:
    size, _, weights = spec.partition(":")
    weights = weights or "bf16"
    hidden, inter, heads, kv_heads, dim, window = SHAPES[size]
    run(f"{size}_{weights}_sliding", scalars, weights, hidden, inter, heads, kv_heads, dim, window, window)
    run(f"{size}_{weights}_global", scalars, weights, hidden, inter, heads, kv_heads, dim, 2304, 2300)
