"""A Gemma 3 GGUF of a published shape whose weights are random blocks of
llama.cpp's quantized types, written directly: no F16 file and no
llama-quantize run (a 12B Q4_K_M file in seconds; 27B, whose F16 file does
not fit the GPU machine's disk beside its quantized copy, at all). Speed
does not depend on the values, so each block is random bytes with small,
finite f16 scales.

Layouts:
  q4_k_m  the types llama-quantize's Q4_K_M gives Gemma 3: the tied
          embedding Q6_K; attn_v and ffn_down Q6_K in the first and last
          eighth of the layers and every third between, Q4_K elsewhere;
          every other matrix Q4_K; a matrix whose rows are not whole
          256-value blocks falls back to Q5_0 (Q4_K) or Q8_0 (Q6_K);
  q8_0    every matrix Q8_0.
Norms are F32 ones. Metadata and tokenizer come from the 270M file's
(`../shared/llamacpp/gemma3-270m-meta.json.gz`), with the shape's sizes.

Usage: python3 mkgguf_blocks.py SIZE LAYOUT META.json.gz OUT.gguf GGUF_PY_DIR
  SIZE: 270m 1b 4b 12b 27b; GGUF_PY_DIR: llama.cpp's gguf-py folder.
"""
import gzip
import json
import os
import sys
import time

import numpy as np

SIZE, LAYOUT, META, OUT, GGUF_PY = sys.argv[1:6]
sys.path.insert(0, GGUF_PY)
import gguf  # noqa: E402

QT = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType

# Hidden size, layers, query heads, key/value heads, head size, MLP size,
# sliding window, context (the published configurations).
SHAPES = {
    "270m": (640, 18, 4, 1, 256, 2048, 512, 32768),
    "1b": (1152, 26, 4, 1, 256, 6912, 512, 32768),
    "4b": (2560, 34, 8, 4, 256, 10240, 1024, 131072),
    "12b": (3840, 48, 16, 8, 256, 15360, 1024, 131072),
    "27b": (5376, 62, 32, 16, 128, 21504, 1024, 131072),
}
VOCAB = 262144

# Values and bytes per block, and the byte offsets of each block's f16
# scales.
BLOCKS = {
    QT.Q4_K: (256, 144, (0, 2)),
    QT.Q6_K: (256, 210, (208,)),
    QT.Q5_0: (32, 22, (0,)),
    QT.Q8_0: (32, 34, (0,)),
}
FALLBACK = {QT.Q4_K: QT.Q5_0, QT.Q6_K: QT.Q8_0}


def block_pool(qtype, rng, count=1 << 18):
    """`count` random blocks of `qtype` with f16 scales in ±[2e-4, 1e-3]."""
    _, nbytes, scales = BLOCKS[qtype]
    pool = rng.integers(0, 256, size=(count, nbytes), dtype=np.uint8)
    for at in scales:
        magnitude = rng.uniform(2e-4, 1e-3, size=count)
        sign = np.where(rng.integers(0, 2, size=count) == 1, -1.0, 1.0)
        pool[:, at:at + 2] = (magnitude * sign).astype(np.float16).view(np.uint8).reshape(count, 2)
    return pool.reshape(-1)


def more_bits(layer, layers):
    """llama-quantize's use_more_bits: the first and last eighth, every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def main():
    hidden, layers, heads, kv_heads, dim, ff, window, context = SHAPES[SIZE]
    meta = json.load(gzip.open(META, "rt", encoding="utf-8"))
    rng = np.random.default_rng(0)
    pools = {}

    def matrix(qtype, rows, cols):
        """`rows` × `cols` values of `qtype` (or its fallback) as block bytes."""
        values, _, _ = BLOCKS[qtype]
        if cols % values:
            qtype = FALLBACK[qtype]
            values, _, _ = BLOCKS[qtype]
        _, nbytes, _ = BLOCKS[qtype]
        if qtype not in pools:
            pools[qtype] = block_pool(qtype, rng)
        pool = pools[qtype]
        n = rows * (cols // values) * nbytes
        source = pool if n <= pool.size else np.tile(pool, -(-n // pool.size))
        return source[:n].reshape(rows, (cols // values) * nbytes), qtype

    quantized = LAYOUT == "q4_k_m"
    if LAYOUT not in ("q4_k_m", "q8_0"):
        raise SystemExit(f"unknown layout {LAYOUT} (q4_k_m or q8_0)")
    base = QT.Q4_K if quantized else QT.Q8_0
    fine = QT.Q6_K if quantized else QT.Q8_0

    name = f"Gemma 3 {SIZE.upper()} (random {LAYOUT.upper()} blocks)"
    override = {
        "general.name": name,
        "general.size_label": SIZE.upper(),
        "general.file_type": 15 if quantized else 7,
        "gemma3.context_length": context,
        "gemma3.embedding_length": hidden,
        "gemma3.block_count": layers,
        "gemma3.feed_forward_length": ff,
        "gemma3.attention.head_count": heads,
        "gemma3.attention.head_count_kv": kv_heads,
        "gemma3.attention.key_length": dim,
        "gemma3.attention.value_length": dim,
        "gemma3.attention.sliding_window": window,
    }
    writer = gguf.GGUFWriter(OUT, "gemma3")
    for key, kind, sub, value in meta:
        if key in ("general.architecture", "general.alignment"):
            continue
        value = override.pop(key, value)
        if kind == "ARRAY":
            if sub == "STRING":
                value = [s.encode("utf-8", errors="surrogateescape") for s in value]
            writer.add_key_value(key, value, VT.ARRAY, sub_type=VT[sub])
        else:
            writer.add_key_value(key, value, VT[kind])
    for key, value in override.items():
        writer.add_key_value(key, value, VT.UINT32 if isinstance(value, int) else VT.STRING)

    counts = {}

    def add(tensor_name, qtype, rows, cols):
        data, used = matrix(qtype, rows, cols)
        counts[used.name] = counts.get(used.name, 0) + 1
        writer.add_tensor(tensor_name, data, raw_dtype=used)

    def ones(tensor_name, n):
        writer.add_tensor(tensor_name, np.ones(n, dtype=np.float32))

    add("token_embd.weight", fine, VOCAB, hidden)
    ones("output_norm.weight", hidden)
    for i in range(layers):
        p = f"blk.{i}."
        more = quantized and more_bits(i, layers)
        ones(p + "attn_norm.weight", hidden)
        add(p + "attn_q.weight", base, heads * dim, hidden)
        add(p + "attn_k.weight", base, kv_heads * dim, hidden)
        add(p + "attn_v.weight", fine if more else base, kv_heads * dim, hidden)
        ones(p + "attn_q_norm.weight", dim)
        ones(p + "attn_k_norm.weight", dim)
        add(p + "attn_output.weight", base, hidden, heads * dim)
        ones(p + "post_attention_norm.weight", hidden)
        ones(p + "ffn_norm.weight", hidden)
        add(p + "ffn_gate.weight", base, ff, hidden)
        add(p + "ffn_up.weight", base, ff, hidden)
        add(p + "ffn_down.weight", fine if more else base, hidden, ff)
        ones(p + "post_ffw_norm.weight", hidden)
    start = time.time()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    print(
        f"{SIZE} {LAYOUT}: {os.path.getsize(OUT) / 1e9:.2f} GB in {time.time() - start:.1f} s;"
        f" matrices by type: {dict(sorted(counts.items()))}"
    )


main()
