#!/usr/bin/env bash
# Side-by-side decode speed on the GPU machine: gemma-mlx and mlx-lm 0.32.2 on
# random bfloat16 weights of published Gemma 3 shapes, alternating, same
# synthetic prompt. Run after ../shared/gpu/setup-mlx-cuda.sh has written
# /tmp/site/env.sh. Usage: h200_bench.sh BINARY PROMPT_TOKENS GEN_TOKENS SIZE...
# ROUNDS (default 2) sets the rounds; each round runs our default decode
# (the compiled step with our CUDA kernels, one fused kernel per layer, 16
# steps per host-device synchronisation), the same with 8 steps per
# synchronisation ("default s8"), our eager decode with MLX's own operations
# ("eager, MLX ops"), then mlx-lm. After the rounds every KV-cache family
# (affine q8_0/q4_0, TurboQuant turbo4/turbo3, q8_0 keys with turbo4
# values) runs through the compiled step and eagerly; KV=0 skips them.
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
    echo "== $size: warm-up (our kernels compile unless ~/.cache/gemma-mlx/kernels has them)"
    echo "ours first run    $size: $(ours "$size")"
    python3 "$here/mlx_lm_random.py" "$configs/gemma3-$size.json" 64 8 >/dev/null
    for round in $(seq "${ROUNDS:-2}"); do
        echo "ours default      $size round $round: $(ours "$size")"
        echo "ours default s8   $size round $round: $(ours "$size" --steps-per-sync 8)"
        echo "ours eager, MLX ops $size round $round: $(ours "$size" --decode eager --gpu-kernels=false)"
        echo "mlx-lm            $size round $round: $(theirs "$size")"
    done
    [ "${KV:-1}" = 0 ] && continue
    for kv in ctk=q8_0,ctv=q8_0 ctk=q4_0,ctv=q4_0 ctk=turbo4,ctv=turbo4 ctk=turbo3,ctv=turbo3 ctk=q8_0,ctv=turbo4; do
        echo "ours   $size $kv: $(ours "$size" --kv "$kv")"
        echo "ours   $size $kv eager: $(ours "$size" --kv "$kv" --decode eager)"
    done
done
