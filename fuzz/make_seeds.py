#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ (committed; run again
only to change them). Uses the standard library only; the GGUF seeds cut the
default model's header, so run `cargo xtask setup` first (or set
GEMMA_MLX_MODEL).

Each seed is in its target's input encoding (see the doc comment at the top
of fuzz/fuzz_targets/<target>.rs)."""

import json
import os
import re
import shutil
import struct
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parent
CORPUS = FUZZ / "corpus"
FIXTURES = ROOT / "crates/gemma/tests/fixtures"
MODEL = Path(
    os.environ.get("GEMMA_MLX_MODEL", ROOT / "target/model/gemma-3-270m-q4_k_m.gguf")
)


def write(target, name, data):
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (folder / name).write_bytes(data)


# ---------------------------------------------------------------- GGUF

# Metadata value types of the GGUF specification.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f",
          BOOL: "B", U64: "Q", I64: "q", F64: "d"}
# ggml tensor type ids, block sizes and bytes per block.
DTYPES = {
    "f32": (0, 1, 4), "f16": (1, 1, 2), "q4_0": (2, 32, 18), "q4_1": (3, 32, 20),
    "q5_0": (6, 32, 22), "q5_1": (7, 32, 24), "q8_0": (8, 32, 34),
    "q2_k": (10, 256, 84), "q3_k": (11, 256, 110), "q4_k": (12, 256, 144),
    "q5_k": (13, 256, 176), "q6_k": (14, 256, 210), "bf16": (30, 1, 2),
    "iq4_nl": (20, 32, 18),
}


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(kind, value):
    if kind == STR:
        return gguf_string(value)
    if kind == ARR:
        elem, items = value
        out = struct.pack("<IQ", elem, len(items))
        return out + b"".join(gguf_value(elem, item) for item in items)
    return struct.pack("<" + SCALAR[kind], value)


def gguf(metadata, tensors, alignment=32):
    """metadata: [(key, kind, value)]; tensors: [(name, shape, dtype, data)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, kind, value in metadata:
        out += gguf_string(key) + struct.pack("<I", kind) + gguf_value(kind, value)
    offset = 0
    blobs = []
    for name, shape, dtype, data in tensors:
        type_id = DTYPES[dtype][0]
        out += gguf_string(name) + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", type_id, offset)
        padded = data + b"\0" * (-len(data) % alignment)
        blobs.append(padded)
        offset += len(padded)
    out += b"\0" * (-len(out) % alignment)
    return out + b"".join(blobs)


def read_model_metadata(limit_array):
    """The default model's metadata, arrays cut to `limit_array` items."""
    with open(MODEL, "rb") as f:
        head = f.read(8 << 20)
    pos = 4

    def take(fmt):
        nonlocal pos
        value = struct.unpack_from("<" + fmt, head, pos)[0]
        pos += struct.calcsize("<" + fmt)
        return value

    def string():
        nonlocal pos
        n = take("Q")
        s = head[pos:pos + n].decode()
        pos += n
        return s

    def value(kind):
        if kind == STR:
            return string()
        if kind == ARR:
            elem, n = take("I"), take("Q")
            return elem, [value(elem) for _ in range(n)][:limit_array]
        return take(SCALAR[kind])

    _version, _n_tensors, n_kv = take("I"), take("Q"), take("Q")
    metadata = []
    for _ in range(n_kv):
        key = string()
        kind = take("I")
        metadata.append((key, kind, value(kind)))
    return head, metadata


def first_block(dtype):
    return (FIXTURES / f"gguf/blocks/{dtype}.blocks.bin").read_bytes()


def gguf_seeds():
    head, metadata = read_model_metadata(600)
    write("gguf", "model_head_4k.gguf", head[:4096])
    source = (ROOT / "crates/gemma/src/chat_template.rs").read_text()
    template = re.search(r'GEMMA3_CHAT_TEMPLATE: &str = r#"(.*?)"#;', source, re.S)[1]
    metadata.append(("tokenizer.chat_template", STR, template))
    tensors = []
    for dtype, (_id, block, size) in DTYPES.items():
        blocks = first_block(dtype)[:size] if dtype != "iq4_nl" else bytes(size)
        tensors.append((f"blk.0.{dtype}.weight", [block], dtype, blocks))
    tensors.append(("token_embd.weight", [32, 4], "q8_0", first_block("q8_0")[:34] * 4))
    tensors.append(("output_norm.weight", [4], "f32", struct.pack("<4f", 1, 2, 3, 4)))
    write("gguf", "model_600_tokens_all_types.gguf", gguf(metadata, tensors))
    for dtype, (_id, block, size) in DTYPES.items():
        if dtype == "iq4_nl":
            continue
        data = first_block(dtype)[: 2 * size]
        tensor = [("t", [block, 2], dtype, data)]
        meta = [("general.architecture", STR, "gemma3"), ("general.alignment", U32, 64)]
        write("gguf", f"blocks_{dtype}.gguf", gguf(meta, tensor, alignment=64))
    # A tensor of 1 TiB in a file of a few hundred bytes: refused at open.
    huge = [("huge", [1 << 18, 1 << 20], "f32", b"")]
    write("gguf", "tensor_1tib.gguf", gguf([("general.architecture", STR, "gemma3")], huge))


# --------------------------------------------------------- safetensors

def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, data)]."""
    header = {}
    blobs = b""
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blobs), len(blobs) + len(data)]}
        blobs += data
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + blobs


def f32s(*values):
    return struct.pack(f"<{len(values)}f", *values)


def safetensors_seeds():
    dense = safetensors([
        ("model.norm.weight", "F32", [4], f32s(1, 2, 3, 4)),
        ("language_model.model.embed_tokens.weight", "F16", [2, 2], bytes(8)),
        ("vision_tower.patch.weight", "BF16", [2], bytes(4)),
    ], {"format": "pt"})
    write("safetensors", "single_dense", b"\x00" + dense)
    quantized = safetensors([
        ("model.layers.0.mlp.down_proj.weight", "U32", [2, 8], bytes(64)),
        ("model.layers.0.mlp.down_proj.scales", "BF16", [2, 1], bytes(4)),
        ("model.layers.0.mlp.down_proj.biases", "BF16", [2, 1], bytes(4)),
        ("model.embed_tokens.weight", "U32", [4, 16], bytes(256)),
        ("model.embed_tokens.scales", "F16", [4, 2], bytes(16)),
        ("model.embed_tokens.biases", "F16", [4, 2], bytes(16)),
        ("model.norm.weight", "F32", [2], f32s(1, 1)),
    ])
    write("safetensors", "single_quantized", bytes([2 << 1]) + quantized)
    first = safetensors([("model.norm.weight", "F32", [2], f32s(0.5, 1.5))])
    second = safetensors([("model.embed_tokens.weight", "F32", [2, 2], f32s(1, 2, 3, 4))])
    index = json.dumps({
        "metadata": {"total_size": 24},
        "weight_map": {
            "model.norm.weight": "model-00001-of-00002.safetensors",
            "model.embed_tokens.weight": "model-00002-of-00002.safetensors",
        },
    }).encode()
    sharded = (b"\x01" + struct.pack("<H", len(index)) + index
               + struct.pack("<H", len(first)) + first + second)
    write("safetensors", "sharded", sharded)
    escape = json.dumps({"weight_map": {"model.norm.weight": "../outside.safetensors"}}).encode()
    write("safetensors", "sharded_escape", b"\x01" + struct.pack("<H", len(escape)) + escape)


# ------------------------------------------------------------- config

def config_seeds():
    for path in sorted((FIXTURES / "config").glob("*.json")):
        shutil.copy(path, CORPUS / "config_json" / path.name)


# ---------------------------------------------------------- tokenizer

def tiny_tokenizer_json():
    """A Gemma-shaped tokenizer.json: the special tokens, byte fallback,
    a user-defined newline and a few merges."""
    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    pieces = special + ["\n"] + [f"<0x{b:02X}>" for b in range(256)]
    normal = ["\u2581", "h", "e", "l", "o", "he", "ll", "hell", "hello", "\u2581hello"]
    pieces += normal
    vocab = {p: i for i, p in enumerate(pieces)}

    def added(i, content, special_token):
        return {"id": i, "content": content, "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": not special_token, "special": special_token}

    bos = {"SpecialToken": {"id": "<bos>", "type_id": 0}}
    seq = {"Sequence": {"id": "A", "type_id": 0}}
    return json.dumps({
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added(i, t, True) for i, t in enumerate(special)]
        + [added(6, "\n", False)],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, seq],
            "pair": [bos, seq, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}},
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ]},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": "<unk>",
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
            "vocab": vocab,
            "merges": [["h", "e"], ["l", "l"], ["he", "ll"], ["hell", "o"], ["\u2581", "hello"]],
        },
    }, ensure_ascii=False)


def essays(n):
    return (FIXTURES / "text/essays.txt").read_bytes()[:n]


def tokenizer_seeds():
    texts = {
        "text_hello": b"Hello world",
        "text_essay": essays(1500),
        "text_chat": b"<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
        "text_unicode": "日本語 😀 naïve café — ∑ x² \t\t  \n\n\n  end".encode(),
        "text_html": b"<b>bold</b> <br> <table><tr><td>x</td></tr></table>",
        "text_invalid_utf8": b"ok \xff\xfe bad \xc3( and \xe2\x82 cut",
        "text_space_marker": "a\u2581b \u2581".encode(),
    }
    for name, text in texts.items():
        write("tokenizer", name, b"\x00" + text)
    ids = [2, 105, 2364, 107, 238, 0xE2 + 238, 0x82 + 238, 0xAC + 238, 106, 1, 262143]
    write("tokenizer", "ids_mixed", b"\x01" + struct.pack(f"<{len(ids)}I", *ids))
    write("tokenizer", "ids_outside", b"\x01" + struct.pack("<3I", 2, 262150, 5))
    write("tokenizer", "json_tiny", b"\x02" + tiny_tokenizer_json().encode())


# ------------------------------------------------------ chat template

def chat(flags, *parts):
    return bytes([flags]) + b"\xff".join(parts)


def chat_template_seeds():
    system, user, assistant = b"\x00", b"\x01", b"\x02"
    write("chat_template", "user_only", chat(1, user + b"Hello!"))
    write("chat_template", "system_user", chat(1, system + b"You are terse.", user + b"2+2?"))
    write("chat_template", "multi_turn", chat(
        0, system + b"Answer in French.", user + b"  Hi there \n",
        assistant + b"Bonjour !\n\n", user + "日本語 😀".encode()))
    write("chat_template", "bad_alternation", chat(1, user + b"a", user + b"b"))
    write("chat_template", "empty", chat(1))
    source = (ROOT / "crates/gemma/src/chat_template.rs").read_text()
    template = re.search(r'GEMMA3_CHAT_TEMPLATE: &str = r#"(.*?)"#;', source, re.S)[1]
    write("chat_template", "jinja_gemma3", chat(3, template.encode(), user + b"Hi"))
    small = ("{% for m in messages %}{{ m.role }}: {{ m.content.strip() | upper }}\n"
             "{% if loop.last and m.role == 'system' %}{{ raise_exception('no') }}{% endif %}"
             "{% endfor %}{% if add_generation_prompt %}{{ bos_token }}>{% endif %}")
    write("chat_template", "jinja_small", chat(3, small.encode(), system + b"s", user + b"u"))


# ------------------------------------------------------------ KV spec

def kv_spec_seeds():
    specs = [
        "ctk=q8_0,ctv=q4_0", " ctv=mlx6 , group=32,ctk=f16", "",
        "ctk=turbo3,ctv=f16,start=16", "ctk=mlx2,ctv=mlx3,group=128,start=7",
        "ctk=bf16", "ctv=turbo4,ctk=q8_0", "ctk=mlx4,group=64,start=+5",
        "ctk=mlx5,ctv=bf16,group=128", "ctk=q8_0,ctk=q4_0", "ctk=turbo2,group=64",
        "ctk=q4_1,ctv=q5_1", "ctk=q5_0,ctv=q6_K",
    ]
    for i, spec in enumerate(specs):
        write("kv_spec", f"spec_{i:02}", spec)


# ------------------------------------------------------------ prompts

def prompts_seeds():
    write("prompts_jsonl", "plain", '{"prompt": "Once upon a time"}\n')
    write("prompts_jsonl", "mixed", (
        '{"prompt": "Hello", "chat": true}\n\n'
        '  {"prompt":"Tell me about lighthouses.","chat":false}\r\n'
        '{"prompt": "\\u65e5\\u672c \\ud83d\\ude00 \\"quoted\\"", "extra": [1, 2]}\n'))
    write("prompts_jsonl", "bad_line", '{"prompt": "ok"}\n{"text": 1}\n')
    write("prompts_jsonl", "blank", "\n  \n")


# ------------------------------------------------------------- corpus

def corpus_seeds():
    write("corpus", "essay_ctx16", bytes([16, 4, 1]) + essays(2048))
    write("corpus", "short_ctx2", bytes([2, 15, 2]) + b"A short corpus.")
    write("corpus", "invalid_utf8", bytes([8, 2, 0]) + b"valid start \xc3\x28 then \xff")
    write("corpus", "unicode_ctx64", bytes([64, 3, 3]) + "Ünïcödé 日本語 😀\n\n\t".encode() * 8)


def main():
    if CORPUS.exists():
        shutil.rmtree(CORPUS)
    for target in ["gguf", "safetensors", "config_json", "tokenizer", "chat_template",
                   "kv_spec", "prompts_jsonl", "corpus"]:
        (CORPUS / target).mkdir(parents=True)
    gguf_seeds()
    safetensors_seeds()
    config_seeds()
    tokenizer_seeds()
    chat_template_seeds()
    kv_spec_seeds()
    prompts_seeds()
    corpus_seeds()
    total = sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file())
    print(f"seeds: {sum(1 for p in CORPUS.rglob('*') if p.is_file())} files, {total} bytes")


if __name__ == "__main__":
    main()
