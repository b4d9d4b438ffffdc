#!/usr/bin/env bash
# Side by side on the GPU machine, on the same GGUF files (llama-quantize's
# Q4_K_M or Q8_0 of random-weight Gemma 3 shapes, see
# ../../../shared/llamacpp, or the same layouts written directly by
# mkgguf_blocks.py, which needs no F16 file): gemma-mlx with the blocks as stored
# (`--weights native`), gemma-mlx with them dequantized to bfloat16, and llama.cpp's
# llama-bench, alternating for ROUNDS rounds (default 2). Ours: prompt and
# decode tokens per second for a PROMPT-token synthetic prompt and GEN
# generated tokens, peak GPU memory, and the process's start to its first
# token (wall time less the decode after the first token). llama.cpp:
# `-p PROMPT -n 0` (prompt) and `-p 0 -n GEN -d PROMPT` (decode after a
# PROMPT-token context, as ours measures it), flash attention on. Ours warm:
# `gemma-mlx bench` with the blocks as stored, one process, a short warm-up
# generation first, then the same prompt and generation timed (prompt
# figures comparable with llama-bench's, which also exclude the process's
# start). With KLD_CORPUS set, each round also times a KLD sweep of the
# file (KLD_CHUNKS chunks of 512 tokens, default 10, second halves, one
# q8_0/q8_0 candidate), process wall time: `gemma-mlx kld` against
# llama-perplexity's f16 base run plus its candidate run (LLAMA_PERPLEXITY
# names it). Run after ../shared/gpu/setup-mlx-cuda.sh has written
# /tmp/site/env.sh.
# Usage: h200_gguf_bench.sh BINARY PROMPT_TOKENS GEN_TOKENS FILE...
# LLAMA_BENCH names llama-bench (skipped when unset).
set -uo pipefail
. /tmp/site/env.sh
bin=$1 prompt=$2 gen=$3
shift 3
errors=$(mktemp)
plan=$(mktemp)
trap 'rm -f "$errors" "$plan"' EXIT
# The warm plan: <bos> and PROMPT - 1 ordinary ids (as many as
# --synthetic-prompt gives, not the same ones), GEN tokens, the same logit
# biases.
PROMPT=$prompt GEN=$gen python3 -c '
import json, os
n, gen = int(os.environ["PROMPT"]), int(os.environ["GEN"])
ids = [2] + [3 + (i * 7919 + 11) % 20000 for i in range(n - 1)]
print(json.dumps({"warmup": True, "logit_bias": {"1": -1e30, "106": -1e30},
                  "cases": [{"name": "warm", "prompt": ids, "max_tokens": gen}]}))' >"$plan"
ours() { # file, extra flags; a failed run prints the end of its error output
    local start end out
    start=$(date +%s.%N)
    if out=$("$bin" generate --model "$1" --device gpu --synthetic-prompt "$prompt" --max-tokens "$gen" \
        --logit-bias 1=-1e30 --logit-bias 106=-1e30 --json "${@:2}" 2>"$errors"); then
        end=$(date +%s.%N)
        tail -1 <<<"$out" | START=$start END=$end python3 -c '
import json, os, sys
r = json.load(sys.stdin)
decode = (r["generation_tokens"] - 1) / r["generation_tps"] if r["generation_tps"] else 0.0
print(json.dumps({"prompt_tps": round(r["prompt_tps"]), "generation_tps": round(r["generation_tps"], 1),
                  "peak_gb": round(r["peak_memory_bytes"] / 1e9, 2), "ttft_s": round(r["ttft_s"], 3),
                  "start_to_first_token_s": round(float(os.environ["END"]) - float(os.environ["START"]) - decode, 2),
                  "weights": r.get("weights")}))'
    else
        echo "failed: $(tail -3 "$errors" | tr '\n' ' ')"
    fi
}
warm() { # file: ours as stored, in one process after a warm-up
    local out
    if out=$("$bin" bench --plan "$plan" --model "$1" --device gpu --weights native 2>"$errors"); then
        tail -1 <<<"$out" | python3 -c '
import json, sys
r = json.load(sys.stdin)["results"][0]
print(json.dumps({"prompt_tps": round(r["prompt_tps"]), "generation_tps": round(r["generation_tps"], 1),
                  "peak_gb": round(r["peak_memory_bytes"] / 1e9, 2)}))'
    else
        echo "failed: $(tail -3 "$errors" | tr '\n' ' ')"
    fi
}
llama() { # file, llama-bench flags
    if [ -z "${LLAMA_BENCH:-}" ]; then
        echo "skipped (LLAMA_BENCH unset)"
        return
    fi
    "$LLAMA_BENCH" -m "$1" -ngl 99 -fa 1 -r 1 -o json "${@:2}" 2>"$errors" |
        python3 -c 'import json,sys; print(json.dumps({"tok_s": round(json.load(sys.stdin)[0]["avg_ts"], 1)}))' ||
        echo "failed: $(tail -3 "$errors" | tr '\n' ' ')"
}
seconds_since() { python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$1"; }
kld_ours() { # file: our sweep's wall time
    local start
    start=$(date +%s.%N)
    if "$bin" kld --model "$1" --device gpu --weights native --corpus "$KLD_CORPUS" --ctx 512 \
        --chunks "${KLD_CHUNKS:-10}" --second-half --cand ctk=q8_0,ctv=q8_0 --json >/dev/null 2>"$errors"; then
        echo "$(seconds_since "$start") s"
    else
        echo "failed: $(tail -3 "$errors" | tr '\n' ' ')"
    fi
}
kld_llama() { # file: llama-perplexity's base run and candidate run, wall time each
    local base start times=()
    if [ -z "${LLAMA_PERPLEXITY:-}" ]; then
        echo "skipped (LLAMA_PERPLEXITY unset)"
        return
    fi
    base=$(mktemp)
    for run in "-ctk f16 -ctv f16" "--kl-divergence -ctk q8_0 -ctv q8_0"; do
        start=$(date +%s.%N)
        # shellcheck disable=SC2086 # the run's flags are words
        if ! "$LLAMA_PERPLEXITY" -m "$1" -f "$KLD_CORPUS" -c 512 --chunks "${KLD_CHUNKS:-10}" -ngl 99 -fa on \
            --kl-divergence-base "$base" $run >"$errors" 2>&1; then
            echo "failed: $(tail -3 "$errors" | tr '\n' ' ')"
            rm -f "$base"
            return
        fi
        times+=("$(seconds_since "$start")")
    done
    rm -f "$base"
    echo "base ${times[0]} s + candidate ${times[1]} s"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for file in "$@"; do
    name=$(basename "$file")
    echo "== $name ($(du -h "$file" | cut -f1)): warm-up (our kernels compile unless cached)"
    echo "ours first run        $name: $(ours "$file" --weights native)"
    for round in $(seq "${ROUNDS:-2}"); do
        echo "ours as stored        $name round $round: $(ours "$file" --weights native)"
        echo "ours as stored, warm  $name round $round: $(warm "$file")"
        echo "ours dequantized      $name round $round: $(ours "$file" --weights dequantized)"
        echo "llama.cpp decode      $name round $round: $(llama "$file" -p 0 -n "$gen" -d "$prompt")"
        echo "llama.cpp prompt      $name round $round: $(llama "$file" -p "$prompt" -n 0)"
        if [ -n "${KLD_CORPUS:-}" ]; then
            echo "ours KLD sweep        $name round $round: $(kld_ours "$file")"
            echo "llama-perplexity      $name round $round: $(kld_llama "$file")"
        fi
    done
done
