"""Where a real decode's time goes, layer kernel by layer kernel, on the GPU
machine: block 0 of every `decode_layer` kernel reads `%globaltimer` at its
start, inside attention, after each grid barrier and at its end (the
attention stamps assume one attention item per block, as on the H200).

`patch` rewrites crates/gemma/src/cuda/decode_layer.rs in place (undo
with `git checkout` of that file after building): the kernels of a token
whose position is 5 modulo 64 keep their stamps in module globals, and the
next token's kernels print them (`printf` inside a measured token would
cost it 20-30 us a kernel). `report` reads the output of such a build and
prints medians over layers and tokens, in us, for sliding and global layers
(a layer counts as global where it attends to more than 1100 keys, as with
2048-token prompts).

    python3 xtask/gpu/layer_stamps.py patch
    cargo build --release -p engine --bin gemma-mlx      # then carry it over
    git checkout crates/gemma/src/cuda/decode_layer.rs
    # on the GPU machine:
    gemma-mlx generate --random-weights 27b --device gpu --synthetic-prompt 2048 \\
        --max-tokens 256 --json | python3 xtask/gpu/layer_stamps.py report
"""
import collections
import statistics
import sys

SOURCE = "crates/gemma/src/cuda/decode_layer.rs"
SLOTS = 64
STAMPS = 12
PHASES = ["Q/K/V", "attention start", "keys", "block merge", "split merge+barrier",
          "output", "gate/up", "down", "residual"]

GLOBALS = f'''
__device__ unsigned long long gemma_stamps[{SLOTS}][{STAMPS}];
__device__ int gemma_stamp_slot;
__device__ int gemma_stamp_position;
"#;

/// The kernel body; see the module documentation.'''

STAMP = ('  if (blockIdx.x == 0 && threadIdx.x == 0) { unsigned long long t_; '
         'asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t_)); '
         f'if (stamp_count < {STAMPS}) stamps[stamp_count++] = t_; }}\n')

SLOT = ('  if (blockIdx.x == 0 && threadIdx.x == 0) { '
        'if (gemma_stamp_position != position[0]) { gemma_stamp_position = position[0]; '
        'gemma_stamp_slot = 0; } stamp_slot = gemma_stamp_slot++; }\n')

PRINT = f'''  if (blockIdx.x == 0 && threadIdx.x == 0 && stamp_slot < {SLOTS}) {{
    if (position[0] % 64 == 5) {{
      for (int k = 0; k < 10; ++k) gemma_stamps[stamp_slot][k] = stamps[k];
      gemma_stamps[stamp_slot][11] = valid[0];
    }}
    if (position[0] % 64 == 6) {{
      const unsigned long long* t = gemma_stamps[stamp_slot];
      printf("S %d %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu\\n", position[0] - 1,
             t[11], t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9]);
    }}
  }}
'''


def replace(text, anchor, new):
    """`text` with its first `anchor` replaced by `new`; the anchor must be there."""
    if anchor not in text:
        sys.exit(f"layer_stamps: the kernel changed, no anchor {anchor!r}")
    return text.replace(anchor, new, 1)


def patch():
    s = open(SOURCE).read()
    s = replace(s, '"#;\n\n/// The kernel body; see the module documentation.', GLOBALS)
    s = replace(s, "  const int G = gridDim.x;\n",
                f"  const int G = gridDim.x;\n  unsigned long long stamps[{STAMPS}]; "
                "int stamp_count = 0; int stamp_slot = 0;\n")
    first = "  // 1. Input norm (every block, into shared memory), Q/K/V projection;\n"
    s = replace(s, first, STAMP + SLOT + first)
    keys = "      __syncthreads();\n      const int chunk = (n + S - 1) / S;\n"
    s = replace(s, keys, keys + STAMP)
    merge = "      // The warps' partial outputs, one query head at a time."
    s = replace(s, merge, STAMP + merge)
    last = ("      if (tid == 0) last_split = atomicAdd(done + group, 1u) == "
            "static_cast<unsigned int>(S - 1);\n      __syncthreads();\n")
    s = replace(s, last, last + STAMP)
    barrier = "  gemma_grid_sync(bar, G);\n"
    if s.count(barrier) != 5:
        sys.exit("layer_stamps: the kernel no longer has five grid barriers")
    s = s.replace(barrier, barrier + STAMP)
    end = ("      out[i] = static_cast<T>(static_cast<float>(gemma_load(hmid + i)) + "
           "static_cast<float>(r));\n    }\n  }\n")
    s = replace(s, end, end + STAMP + PRINT)
    open(SOURCE, "w").write(s)
    print(f"patched {SOURCE}: build, then `git checkout {SOURCE}`")


def median(values):
    ordered = sorted(values)
    return (f"{statistics.median(ordered):.1f} (p10 {ordered[len(ordered) // 10]:.1f}, "
            f"p90 {ordered[9 * len(ordered) // 10]:.1f})")


def report(lines, window=1100):
    """Medians of each phase for sliding and global layers (a global layer's
    valid count exceeds `window`), of the kernels and of the gaps between
    consecutive kernels, from "S position valid t0..t9" lines."""
    tokens = collections.defaultdict(list)
    for line in lines:
        fields = line.split()
        if len(fields) == 13 and fields[0] == "S":
            tokens[int(fields[1])].append([int(v) for v in fields[2:]])
    phases, kernels, gaps = collections.defaultdict(list), [], []
    for position, layers in sorted(tokens.items()):
        layers.sort(key=lambda layer: layer[1])
        for valid, *t in layers:
            kind = "global" if valid > window else "sliding"
            for i, name in enumerate(PHASES):
                phases[(kind, i)].append((t[i + 1] - t[i]) / 1e3)
            kernels.append((t[9] - t[0]) / 1e3)
        gaps += [(b[1] - a[10]) / 1e3 for a, b in zip(layers, layers[1:])]
        print(f"position {position}: {len(layers)} layers, first start to last end "
              f"{(layers[-1][10] - layers[0][1]) / 1e3:.0f} us")
    if not kernels:
        sys.exit("layer_stamps: no stamp lines (a build with `patch`, 70 or more tokens?)")
    for (kind, i) in sorted(phases):
        print(f"{kind:8} {PHASES[i]:20} {median(phases[(kind, i)])}")
    print(f"kernel, start to end     {median(kernels)}")
    if gaps:
        print(f"end to the next start    {median(gaps)}")


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "patch":
        patch()
    elif command == "report":
        report(sys.stdin)
    else:
        sys.exit(__doc__)
