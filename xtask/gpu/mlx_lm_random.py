"""mlx-lm 0.32.2 on random weights of a published Gemma 3 shape: prompt and
generation speed, for side-by-side runs with `gemma-mlx generate
--random-weights SIZE --synthetic-prompt N` on the GPU machine.

Usage: python3 mlx_lm_random.py CONFIG.json PROMPT_TOKENS GEN_TOKENS [kv_bits]
Prints one JSON line: prompt_tps, generation_tps, ttft_s, peak_memory_bytes,
weight_bytes (the parameters' bytes, for the bandwidth bound).
The prompt is the same synthetic sequence `gemma-mlx --synthetic-prompt`
builds: <bos> then a fixed linear congruential sequence over ids 1000..200000.
"""
import json
import sys
import time

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models import gemma3_text
from mlx.utils import tree_flatten


def synthetic_prompt(n):
    state = 0x2545F491
    ids = [2]
    mask = (1 << 64) - 1
    for _ in range(1, n):
        state = (state * 6364136223846793005 + 1442695040888963407) & mask
        ids.append(1000 + (state >> 33) % 199000)
    return ids[:n]


def main():
    config_path, prompt_tokens, gen_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    kv_bits = int(sys.argv[4]) if len(sys.argv) > 4 else None
    config = json.load(open(config_path))
    config = config.get("text_config", config)
    config["model_type"] = "gemma3_text"
    args = gemma3_text.ModelArgs.from_dict(config)
    model = gemma3_text.Model(args)
    model.sanitize({})
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    prompt = mx.array(synthetic_prompt(prompt_tokens))
    mx.reset_peak_memory()
    start = time.perf_counter()
    first = None
    n = 0
    kwargs = {"kv_bits": kv_bits, "kv_group_size": 64} if kv_bits else {}
    for token, _ in generate_step(prompt, model, max_tokens=gen_tokens, **kwargs):
        if first is None:
            first = time.perf_counter()
        n += 1
    end = time.perf_counter()
    print(json.dumps({
        "engine": "mlx-lm",
        "prompt_tps": prompt_tokens / (first - start),
        "generation_tps": (n - 1) / (end - first),
        "ttft_s": first - start,
        "generation_tokens": n,
        "peak_memory_bytes": mx.get_peak_memory(),
        "weight_bytes": sum(a.nbytes for _, a in tree_flatten(model.parameters())),
    }))


if __name__ == "__main__":
    main()
