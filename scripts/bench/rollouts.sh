#!/usr/bin/env bash
# The rollout table of BENCHMARKS.md: for each row, this checkout's petting, an older
# binary, and transformers' generate on the prompts ours sampled, one after another.
#
# Usage: PY=/path/to/pyref/bin/python scripts/bench/rollouts.sh BEFORE_BINARY
#   BEFORE_BINARY: petting built from an older commit (run with LD_LIBRARY_PATH=.libtorch/lib)
#   PY: a python with torch 2.11.0 and transformers (../shared/bench/anchors/setup-pyref.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
before=$(realpath "${1:?usage: scripts/bench/rollouts.sh BEFORE_BINARY}")
export LD_LIBRARY_PATH=$PWD/.libtorch/lib
cargo build --locked --quiet --bin petting
row() { # model workflow mode k tasks
    local model=$1 workflow=$2 mode=$3
    export K=$4 TASKS=$5 MAX_NEW=64
    scripts/bench/rollout.sh target/debug/petting "models/$model" "$workflow" "$mode" after
    scripts/bench/rollout.sh "$before" "models/$model" "$workflow" "$mode" before
    "${PY:?set PY}" scripts/bench/rollout_hf.py "bench-results/prompts-after-$model-$workflow-$mode.json" \
        "models/$model" "$MAX_NEW" transformers
}
row smollm2-135m-instruct math tree 8 16
row smollm2-135m-instruct math independent 4 16
row smollm2-135m-instruct plan-path tree 8 16
row smollm2-135m-instruct plan-path independent 4 16
row qwen2.5-coder-0.5b-instruct math tree 8 8
row qwen2.5-coder-0.5b-instruct plan-path independent 4 8
# The first row again in a quarter GiB of key/value cache.
K=8 TASKS=16 MAX_NEW=64 scripts/bench/rollout.sh target/debug/petting models/smollm2-135m-instruct math tree \
    after-budget-0.25gib --set rollout.kv_cache_gib=0.25
