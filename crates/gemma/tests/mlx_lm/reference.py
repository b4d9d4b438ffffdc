#!/usr/bin/env python3
"""mlx-lm's side of the parity tests (crates/gemma/tests/parity_*.rs).

Runs mlx-lm 0.32.2 (mlx 0.32.4) on token ids the Rust test chose and writes
what it computed, so the test can compare it with crate `gemma`'s forward pass.

Usage:

    python reference.py REQUEST.json

The tests run it with the interpreter of `<workspace>/target/py/venv`
(`cargo xtask setup` creates it; env `GEMMA_MLX_PYTHON` names another one).
Without that interpreter they fail; `GEMMA_MLX_SKIP_PARITY=1` skips them.

REQUEST.json:

    {
      "model": "/path/to/hf-folder",     # config.json + model.safetensors
      "response": "/path/to/out.json",   # where the answer goes
      "runs": [ RUN, ... ]
    }

A RUN is one of:

    {"kind": "logits",
     "cache": CACHE,
     "chunks": [[ids...], [ids...], ...],
     "out": "/path/to/logits.f32"}

        A fresh cache, then one `model(mx.array([chunk]), cache=cache)` call
        per chunk, in order. The logits of every position of every chunk are
        written to "out", concatenated along positions: raw little-endian
        float32, row-major [positions, vocab]. Its answer is
        {"positions": P, "vocab": V}.

    {"kind": "greedy",
     "cache": CACHE,
     "prompt": [ids...],
     "max_tokens": N}

        A fresh cache, the prompt in one call, then N - 1 single-token calls,
        each time taking the argmax of the last position's logits (no stop
        tokens). Its answer is {"tokens": [N ids]}.

CACHE is "model" (the model's own `make_prompt_cache`: RotatingKVCache for
sliding layers, KVCache for global ones) or
{"quantized": {"bits": B, "group_size": G}} (a QuantizedKVCache in every
layer; for models whose layers are all global).

"response" receives {"mlx_lm": VERSION, "mlx": VERSION, "runs": [answer, ...]},
the answers in the order of the runs.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache
from mlx_lm.utils import load_model


def make_cache(model, spec):
    if spec == "model":
        return make_prompt_cache(model)
    if isinstance(spec, dict) and "quantized" in spec:
        q = spec["quantized"]
        return [
            QuantizedKVCache(group_size=q["group_size"], bits=q["bits"])
            for _ in model.layers
        ]
    raise ValueError(f"unknown cache {spec!r}")


def run_logits(model, run):
    cache = make_cache(model, run["cache"])
    positions, vocab = 0, None
    with open(run["out"], "wb") as out:
        for chunk in run["chunks"]:
            logits = model(mx.array([chunk], dtype=mx.int32), cache=cache)
            logits = logits[0].astype(mx.float32)
            mx.eval(logits)
            positions += logits.shape[0]
            vocab = logits.shape[1]
            out.write(np.asarray(logits, dtype="<f4").tobytes())
    return {"positions": positions, "vocab": vocab}


def run_greedy(model, run):
    cache = make_cache(model, run["cache"])
    step = mx.array([run["prompt"]], dtype=mx.int32)
    tokens = []
    for _ in range(run["max_tokens"]):
        logits = model(step, cache=cache)
        token = mx.argmax(logits[0, -1], axis=-1)
        mx.eval(token)
        tokens.append(token.item())
        step = mx.array([[tokens[-1]]], dtype=mx.int32)
    return {"tokens": tokens}


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} REQUEST.json")
    request = json.loads(Path(sys.argv[1]).read_text())
    model, _ = load_model(Path(request["model"]))
    answers = []
    for run in request["runs"]:
        if run["kind"] == "logits":
            answers.append(run_logits(model, run))
        elif run["kind"] == "greedy":
            answers.append(run_greedy(model, run))
        else:
            raise ValueError(f"unknown run kind {run['kind']!r}")
    response = {"mlx_lm": mlx_lm.__version__, "mlx": mx.__version__, "runs": answers}
    Path(request["response"]).write_text(json.dumps(response))


if __name__ == "__main__":
    main()
