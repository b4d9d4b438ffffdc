"""TurboQuant reference encoder and decoder (numpy), written from the format's
description in this project's issue 18, as the llama.cpp TurboQuant fork
stores it.

Usage: reference.py BITS IN OUT
  IN:  raw little-endian float32 vectors, rows of 128 values (one group each)
  OUT: JSON {"indices": [[...128 ints...], ...], "norms": [fp16 bits, ...],
             "norms_f32": [the norm before its rounding to fp16, ...],
             "rotated": [[...128 floats...], ...]}

Each 128-value group x is encoded on its own:
  g = |x|_2 (float32); u = x / g (0 when g <= 1e-10)
  y = D(s2) (H / sqrt(128)) D(s1) u   (H: the unnormalised Walsh-Hadamard
      matrix as a butterfly over h = 1, 2, ..., 64; scaled after it)
  idx_j = number of midpoints m with y_j >= m
  norm = fp16(g / |c[idx]|_2), or fp16(g) when that denominator is <= 1e-10.
Decoding gives c[idx] * norm in the rotated domain.
"""

import json
import sys

import numpy as np

N = 128
SIGNS1 = bytes.fromhex("59036ae44959f842bb3bc6a4a950f249")
SIGNS2 = bytes.fromhex("90eeac16dc8f623f7a35a5b76265a5be")

HALF_CODEBOOKS = {
    2: [0.039994, 0.133462],
    3: [0.021460, 0.065717, 0.117832, 0.190685],
    4: [0.006938, 0.020989, 0.035597, 0.051262,
        0.068756, 0.089527, 0.117195, 0.173926],
}
HALF_MIDPOINTS = {
    2: [0.086728],
    3: [0.043589, 0.091775, 0.154259],
    4: [0.013963, 0.028293, 0.043430, 0.060009, 0.079142, 0.103361, 0.145560],
}


def signs(table):
    """+-1 per element: byte k bit j is element 8k + j, a set bit is -1."""
    return np.array([-1.0 if (table[i // 8] >> (i % 8)) & 1 else 1.0
                     for i in range(N)], dtype=np.float32)


def codebook(bits):
    half = np.array(HALF_CODEBOOKS[bits], dtype=np.float32)
    return np.concatenate([-half[::-1], half])


def midpoints(bits):
    half = np.array(HALF_MIDPOINTS[bits], dtype=np.float32)
    return np.concatenate([-half[::-1], [np.float32(0.0)], half])


def hadamard(x):
    """The unnormalised Walsh-Hadamard transform of each row, in float32."""
    x = x.astype(np.float32).copy()
    h = 1
    while h < N:
        y = x.reshape(x.shape[0], N // (2 * h), 2, h)
        a = y[:, :, 0, :].copy()
        b = y[:, :, 1, :].copy()
        y[:, :, 0, :] = a + b
        y[:, :, 1, :] = a - b
        x = y.reshape(x.shape[0], N)
        h *= 2
    return x


def rotate(u):
    scale = np.float32(1.0 / np.sqrt(N))
    return signs(SIGNS2) * (hadamard(signs(SIGNS1) * u) * scale)


def encode(x, bits):
    x = x.astype(np.float32)
    g = np.sqrt(np.sum(x * x, axis=1, dtype=np.float32)).astype(np.float32)
    safe = np.where(g > 1e-10, g, np.float32(1.0))
    u = np.where((g > 1e-10)[:, None], x / safe[:, None], np.float32(0.0))
    y = rotate(u).astype(np.float32)
    idx = np.sum(y[:, :, None] >= midpoints(bits)[None, None, :], axis=2)
    c = codebook(bits)[idx]
    cn = np.sqrt(np.sum(c * c, axis=1, dtype=np.float32)).astype(np.float32)
    norm = np.where(cn > 1e-10, g / np.where(cn > 1e-10, cn, 1.0), g)
    return idx.astype(np.int64), norm.astype(np.float32), y


def decode_rotated(idx, norms, bits):
    half = norms.astype(np.float16).astype(np.float32)
    return codebook(bits)[idx] * half[:, None]


def main():
    bits, src, dst = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    x = np.fromfile(src, dtype="<f4").reshape(-1, N)
    idx, norms, y = encode(x, bits)
    with open(dst, "w") as f:
        json.dump({
            "indices": idx.tolist(),
            "norms": norms.astype(np.float16).view(np.uint16).tolist(),
            "norms_f32": norms.tolist(),
            "rotated": y.tolist(),
        }, f)


if __name__ == "__main__":
    main()
