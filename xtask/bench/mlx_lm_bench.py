"""mlx-lm's side of `cargo xtask bench`.

Runs the cases of a benchmark plan with mlx-lm's `stream_generate` and
prints one JSON object on stdout; `gemma-mlx bench --plan` reads the same
plan and prints the same fields, so the two are timed the same way.

Usage (the bench runs it; by hand):
    target/py/venv/bin/python xtask/bench/mlx_lm_bench.py PLAN.json MODEL_DIR

The plan (JSON):
    {"warmup": true,
     "logit_bias": {"1": -1e9, "106": -1e9},
     "cases": [{"name": "...", "prompt": [2, 651, ...], "max_tokens": 256,
                "kv_bits": null | 8 | 4, "kv_group_size": 64}]}

Every case starts from a fresh prompt cache. With `kv_bits`, mlx-lm 0.32.2
cannot quantize Gemma 3's sliding-window layers (`RotatingKVCache.to_quantized`
raises NotImplementedError, so `kv_bits=` fails), so this script quantizes
the layers it can: the global layers get a `QuantizedKVCache` from the first
token, the sliding layers keep their `RotatingKVCache` in float.

Timing, for every case: `ttft_s` from the call to the first token,
`prompt_tps` = prompt tokens / `ttft_s`, `generation_tps` = (tokens - 1) /
seconds from the first token to the last; `peak_memory_bytes` from
`mx.get_peak_memory()` reset before the case.
"""

import json
import sys
import time

import mlx.core as mx
import mlx_lm
from mlx_lm.models.cache import KVCache, QuantizedKVCache
from mlx_lm.sample_utils import make_logits_processors


def prompt_cache(model, case):
    """A fresh cache; global layers quantized when the case asks for it."""
    cache = model.make_cache()
    bits = case.get("kv_bits")
    if bits is None:
        return cache
    group = case.get("kv_group_size", 64)
    return [
        QuantizedKVCache(group_size=group, bits=bits) if type(c) is KVCache else c
        for c in cache
    ]


def run_case(model, tokenizer, case, processors):
    """Generates for one case and returns its figures and token ids."""
    cache = prompt_cache(model, case)
    prompt = mx.array(case["prompt"], dtype=mx.int32)
    mx.clear_cache()
    mx.reset_peak_memory()
    ids = []
    first = last = None
    start = time.perf_counter()
    for response in mlx_lm.stream_generate(
        model,
        tokenizer,
        prompt,
        max_tokens=case["max_tokens"],
        logits_processors=processors,
        prompt_cache=cache,
    ):
        now = time.perf_counter()
        if first is None:
            first = now
        last = now
        ids.append(int(response.token))
    ttft = first - start
    decode = last - first
    return {
        "name": case["name"],
        "token_ids": ids,
        "prompt_tokens": len(case["prompt"]),
        "prompt_tps": len(case["prompt"]) / ttft,
        "generation_tokens": len(ids),
        "generation_tps": (len(ids) - 1) / decode if len(ids) > 1 and decode > 0 else 0.0,
        "ttft_s": ttft,
        "peak_memory_bytes": mx.get_peak_memory(),
    }


def kv_bits_error(model, tokenizer):
    """What mlx-lm itself does when asked for a quantized cache on this model."""
    try:
        for _ in mlx_lm.stream_generate(
            model, tokenizer, mx.array([2, 651], dtype=mx.int32), max_tokens=2,
            kv_bits=8, quantized_kv_start=0,
        ):
            pass
    except Exception as error:  # noqa: BLE001 - reported, not handled
        return f"{type(error).__name__}: {error}"
    return None


def main():
    plan_path, model_dir = sys.argv[1], sys.argv[2]
    with open(plan_path) as f:
        plan = json.load(f)
    model, tokenizer = mlx_lm.load(model_dir)
    bias = {int(k): float(v) for k, v in plan.get("logit_bias", {}).items()}
    processors = make_logits_processors(logit_bias=bias) if bias else None
    if plan.get("warmup") and plan["cases"]:
        warm = dict(plan["cases"][0], max_tokens=4)
        run_case(model, tokenizer, warm, processors)
    results = [run_case(model, tokenizer, case, processors) for case in plan["cases"]]
    print(json.dumps({
        "engine": f"mlx-lm {mlx_lm.__version__}",
        "mlx_version": mx.__version__,
        "kv_bits_error": kv_bits_error(model, tokenizer),
        "results": results,
    }))


if __name__ == "__main__":
    main()
