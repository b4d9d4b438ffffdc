#!/usr/bin/env bash
# Side-by-side decode speed on the GPU machine: gemma-mlx and mlx-lm 0.32.2 on
# random bfloat16 weights of published Gemma 3 shapes, alternating, same
# synthetic prompt. Run after ../shared/gpu/setup-mlx-cuda.sh has written
# /tmp/site/env.sh. Usage: h200_bench.sh BINARY PROMPT_TOKENS GEN_TOKENS SIZE...
# ROUNDS (default 2) sets the rounds; each round runs our default decode
# (the compiled step with our CUDA kernels, one fused kernel per layer, 16
# steps per host-device synchronisation), the same with 8 steps per
# synchronisation ("default s8"), our eager decode with MLX's own operations
# ("eager, MLX ops"), mlx-lm, then llama.cpp. After the rounds, ROUNDS more
# of every KV-cache family (affine q8_0/q4_0, TurboQuant turbo4/turbo3,
# q8_0 keys with turbo4 values) through the compiled step and eagerly, with
# llama.cpp beside ours on the types it has (f16, q8_0, q4_0); KV=0 skips
# them, KV_SPECS replaces the list of specs, EAGER=0 leaves out the eager
# compressed-cache runs and EXTRAS=0 the s8, MLX-ops and mlx-lm runs (for
# the large sizes and long contexts, where device time is short). The first
# compressed-cache run of each size comes first, so that its time to first
# token is a fresh machine's.
#
# llama.cpp runs when LLAMA_BENCH names its llama-bench and
# ${GGUF_DIR:-/root}/gemma3-SIZE-f16.gguf exists (../../../shared/llamacpp
# builds both): `-p 0 -n GEN -d PROMPT`, the generation of GEN tokens after
# a PROMPT-token context, as ours measures it, flash attention on.
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
llama() { # size, extra llama-bench flags
    local gguf=${GGUF_DIR:-/root}/gemma3-$1-f16.gguf
    if [ -z "${LLAMA_BENCH:-}" ] || [ ! -f "$gguf" ]; then
        echo "skipped (LLAMA_BENCH unset or no $gguf)"
        return
    fi
    "$LLAMA_BENCH" -m "$gguf" -p 0 -n "$gen" -d "$prompt" -ngl 99 -fa 1 -r 1 -o json "${@:2}" 2>"$errors" |
        python3 -c 'import json,sys; print(json.dumps({"generation_tps": round(json.load(sys.stdin)[0]["avg_ts"], 1)}))' ||
        echo "failed: $(tail -3 "$errors" | tr '\n' ' ')"
}
# llama-bench's flags for a KV spec of types it has; nothing for the others.
llama_kv() {
    case $1 in
    ctk=q8_0,ctv=q8_0) echo "-ctk q8_0 -ctv q8_0" ;;
    ctk=q4_0,ctv=q4_0) echo "-ctk q4_0 -ctv q4_0" ;;
    esac
}
kv_specs=${KV_SPECS:-"ctk=q8_0,ctv=q8_0 ctk=q4_0,ctv=q4_0 ctk=turbo4,ctv=turbo4 ctk=turbo3,ctv=turbo3 ctk=q8_0,ctv=turbo4"}
for size in "$@"; do
    echo "== $size: warm-up (our kernels compile unless ~/.cache/gemma-mlx/kernels has them)"
    echo "ours first run    $size: $(ours "$size")"
    [ "${KV:-1}" = 0 ] || echo "ours first run    $size ctk=q8_0,ctv=q8_0: $(ours "$size" --kv ctk=q8_0,ctv=q8_0)"
    [ "${EXTRAS:-1}" = 0 ] || python3 "$here/mlx_lm_random.py" "$configs/gemma3-$size.json" 64 8 >/dev/null
    for round in $(seq "${ROUNDS:-2}"); do
        echo "ours default      $size round $round: $(ours "$size")"
        if [ "${EXTRAS:-1}" != 0 ]; then
            echo "ours default s8   $size round $round: $(ours "$size" --steps-per-sync 8)"
            echo "ours eager, MLX ops $size round $round: $(ours "$size" --decode eager --gpu-kernels=false)"
            echo "mlx-lm            $size round $round: $(theirs "$size")"
        fi
        echo "llama.cpp f16 KV  $size round $round: $(llama "$size")"
    done
    [ "${KV:-1}" = 0 ] && continue
    for round in $(seq "${ROUNDS:-2}"); do
        for kv in $kv_specs; do
            echo "ours   $size $kv round $round: $(ours "$size" --kv "$kv")"
            [ "${EAGER:-1}" = 0 ] || echo "ours   $size $kv eager round $round: $(ours "$size" --kv "$kv" --decode eager)"
            flags=$(llama_kv "$kv")
            # shellcheck disable=SC2086
            [ -n "$flags" ] && echo "llama.cpp $size $kv round $round: $(llama "$size" $flags)"
        done
    done
done
