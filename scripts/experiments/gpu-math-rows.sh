#!/usr/bin/env bash
# Runs math rows of RESULTS.md on one GPU at once, with the model folder given (the
# larger-model rows; the CPU rows train SmolLM2-135M), one process per row:
#
#   scripts/experiments/gpu-math-rows.sh PETTING MODEL OUT [SEED] [MINUTES] [ROW...]
#
# ROWs are pipelines/<ROW>.yaml (default: math math-single-agent, the shared team with
# AT-GRPO and the single agent). Each sampler gets a fixed key/value budget, so that
# concurrent processes do not each claim 60% of the GPU's free memory, and full-model rows
# keep the weights of versions 0 and 10 only, besides the newest version (version 5 is
# evaluated before the next update prunes it). Disk is what limits how many rows run at
# once: a full-weight version of a 0.5B model is about 9 GB (bf16 weights, float32 AdamW
# moments and master copy) and a run holds up to three, so a machine with 64 GiB of disk
# takes two (results/math/README.md, "On a GPU").
#
# Runs go to OUT/runs/ and logs to OUT/<row>.log. After MINUTES (default 60) a run still
# going is stopped: its committed stages stay and the same command resumes it. Then
# `petting compare` writes OUT/compare/. DEVICE=cpu runs the same steps without a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
petting=$(readlink -f "$1")
model=$(readlink -f "$2")
mkdir -p "$3/runs"
out=$(readlink -f "$3")
seed=${4:-1}
minutes=${5:-60}
shift $(($# < 5 ? $# : 5))
rows=("$@")
((${#rows[@]})) || rows=(math math-single-agent)
device=${DEVICE:-cuda}

run() {
    local row=$1 policies=(shared)
    [[ $row == math-per-role || $row == math-lora ]] && policies=(tool reasoner)
    local sets=(--set seed="$seed" --set store="$out/runs/$row-s$seed"
        --set rollout.kv_cache_gib=4 --set evaluation.kv_cache_gib=4)
    if grep -q 'weights: true' "pipelines/$row.yaml"; then
        sets+=(--set retention.keep_every=10)
    fi
    for policy in "${policies[@]}"; do
        sets+=(--set "policies.$policy.model=$model" --set "policies.$policy.device=$device")
    done
    timeout "${minutes}m" "$petting" pipeline run "pipelines/$row.yaml" "${sets[@]}" >"$out/$row.log" 2>&1 ||
        echo "$row stopped: $(tail -n 1 "$out/$row.log")"
}

for row in "${rows[@]}"; do
    run "$row" &
done
wait
"$petting" compare "$out"/runs/* --output "$out/compare" || echo "compare failed"
