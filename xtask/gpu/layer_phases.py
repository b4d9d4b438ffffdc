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

Usage: python3 xtask/gpu/layer_phases.py SOURCE.json [small|wide] [270m|1b|12b|27b ...]
  small: position, write slot and valid count as 4-byte arrays (MLX keeps
         arrays of 8 bytes or less in a managed pool advised read-mostly);
  wide:  the same values in 16-byte arrays (the default).
Sizes default to 270m.
"""
import json
import statistics
import sys

import mlx.core as mx

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
    body = insert("    if constexpr (WQF == 0 && WKF == 0 && WVF == 0) {", "    STAMP(13);\n", after=False)
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


def run(tag, scalars, hidden, inter, heads, kv_heads, dim, capacity, valid):
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
    qkv, gate_up = r((heads + 2 * kv_heads) * dim, hidden), r(2 * inter, hidden)
    u = [unused, unused]
    w = [r(1, 1, hidden), r(hidden) + 1, qkv, *u, qkv, *u, qkv, *u, r(dim) + 1, r(dim) + 1,
         r(hidden, heads * dim), *u, r(hidden) + 1, r(hidden) + 1, gate_up, *u, gate_up, *u,
         r(hidden, inter), *u, r(hidden) + 1,
         scalar(valid - 1), scalar(valid - 1), scalar(valid),
         r(1, kv_heads, capacity, dim), unused, unused,
         r(1, kv_heads, capacity, dim), unused, unused]
    mx.eval(w)
    smem = max(max(hidden, inter, heads * dim) * 2, 16 * dim * 4)
    consts = ("  constexpr float EPS = 1e-6f;\n  constexpr float SCALE = 0.0625f;\n"
              "  constexpr float LOG2_BASE = 13.2877f;\n  constexpr float ROPE_SCALE = 1.0f;\n")
    stamp = f"#define STAMP(k) if (threadIdx.x == 0) {{ times[blockIdx.x * {STAMPS} + (k)] = clock64(); }}\n"
    kernel = mx.fast.cuda_kernel(
        name=f"layer_phases_{scalars}_{tag}", input_names=INPUTS,
        output_names=["out", "scratch", "partials", "times"], source=consts + stamped_body(),
        header=stamp + SOURCE["header"])
    barrier = mx.zeros((160,), mx.int32)
    qb = query_heads_per_block(heads, kv_heads, dim)
    splits = BLOCKS // (heads // qb)

    def call(x):
        return kernel(
            inputs=[x] + w[1:] + [barrier],
            template=[("T", dt), ("D", dim), ("HQ", heads), ("HKV", kv_heads), ("QB", qb), ("PAIR", 1),
                      ("WARPS", 16), ("SMEM", smem), ("KF", 0), ("KB", 0), ("KG", 0),
                      ("VF", 0), ("VB", 0), ("VG", 0), ("INTER", inter)]
            + [(f"W{p}{t}", 0 if t == "F" else 1) for p in "QKVOGUD" for t in "FBG"]
            + [("WQO", 0), ("WKO", heads * dim), ("WVO", (heads + kv_heads) * dim), ("WGO", 0), ("WUO", inter)],
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

    phases = [span(0, 12, "start+norm"), span(13, 1, "QKV"), span(1, 2, "barrier 1"),
              span(2, 14, "q/k norm+RoPE"), span(14, 15, "keys"), span(15, 16, "split merge"),
              span(16, 3, "head merge"), span(3, 4, "barrier 2"), span(4, 5, "o_proj"),
              span(6, 7, "norms+gate/up"), span(8, 9, "down"), span(10, 11, "residual"),
              span(0, 11, "total")]
    print(f"{scalars} {tag}: " + " | ".join(phases), flush=True)


# hidden, intermediate, query heads, key/value heads, head dim, sliding window
SHAPES = {
    "270m": (640, 2048, 4, 1, 256, 512),
    "1b": (1152, 6912, 4, 1, 256, 512),
    "12b": (3840, 15360, 16, 8, 256, 1024),
    "27b": (5376, 21504, 32, 16, 128, 1024),
}

scalars = sys.argv[2] if len(sys.argv) > 2 else "wide"
for size in sys.argv[3:] or ["270m"]:
    hidden, inter, heads, kv_heads, dim, window = SHAPES[size]
    run(f"{size}_sliding", scalars, hidden, inter, heads, kv_heads, dim, window, window)
    run(f"{size}_global", scalars, hidden, inter, heads, kv_heads, dim, 2304, 2300)
