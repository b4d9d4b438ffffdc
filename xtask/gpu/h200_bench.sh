#!/usr/bin/env bash
# Side-by-side decode speed on the GPU machine: gemma-mlx and mlx-lm 0.32.2 on
# random bfloat16 weights of published Gemma 3 shapes, alternating, same
# synthetic prompt. Run after ../shared/gpu/setup-mlx-cuda.sh has written
# /tmp/site/env.sh. Usage: h200_bench.sh BINARY PROMPT_TOKENS GEN_TOKENS SIZE...
# ROUNDS (default 2) sets the rounds; each round runs our eager decode, our
# compiled decode, the compiled decode with our CUDA kernels (one fused
# kernel per layer: "compiled+k"), the same with one step per host-device
# synchronisation instead of the GPU default of 8 ("compiled+k s1"), then
# mlx-lm.
set -uo pipefail
. /tmp/site/env.sh
bin=$1 prompt=$2 gen=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
configs=$here/../../crates/gemma/configs
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 "$here/read_bandwidth.py"
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
ours() { # size, extra flags; a failed run prints the end of its error output
    local out
    if out=$("$bin" generate --random-weights "$1" --device gpu --synthetic-prompt "$prompt" --max-tokens "$gen" \
        --logit-bias 1=-1e30 --logit-bias 106=-1e30 --json "${@:2}" 2>"$errors"); then
        tail -1 <<<"$out" |
            python3 -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps({k: r[k] for k in ("prompt_tps","generation_tps","ttft_s","generation_tokens","peak_memory_bytes")}))'
    else
        echo "failed: $(tail -3 "$errors" | tr '\n' ' ')"
    fi
}
theirs() { python3 "$here/mlx_lm_random.py" "$configs/gemma3-$1.json" "$prompt" "$gen"; }
for size in "$@"; do
    echo "== $size: warm-up (kernels compile at first use)"
    "$bin" generate --random-weights "$size" --device gpu --synthetic-prompt 64 --max-tokens 8 --json >/dev/null 2>&1
    python3 "$here/mlx_lm_random.py" "$configs/gemma3-$size.json" 64 8 >/dev/null
    "$bin" generate --random-weights "$size" --device gpu --synthetic-prompt 64 --max-tokens 8 --gpu-kernels --json >/dev/null 2>&1
    for round in $(seq "${ROUNDS:-2}"); do
        echo "ours eager        $size round $round: $(ours "$size" --decode eager)"
        echo "ours compiled     $size round $round: $(ours "$size" --decode compiled)"
        echo "ours compiled+k   $size round $round: $(ours "$size" --decode compiled --gpu-kernels)"
        echo "ours compiled+k s1 $size round $round: $(ours "$size" --decode compiled --gpu-kernels --steps-per-sync 1)"
        echo "mlx-lm            $size round $round: $(theirs "$size")"
    done
    [ "${KV:-1}" = 0 ] && continue
    echo "ours   $size q8 KV: $(ours "$size" --kv ctk=q8_0,ctv=q8_0)"
    echo "ours   $size q4 KV: $(ours "$size" --kv ctk=q4_0,ctv=q4_0)"
done
