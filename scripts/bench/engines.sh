#!/usr/bin/env bash
# The engine table of BENCHMARKS.md: the same rollouts (prompts, seeds, model) sampled by
# petting's tch sampler and by a vLLM server, one after the other, with
# scripts/bench/rollout.sh. The server must serve models/smollm2-135m-instruct (e.g.
# `scripts/servers/vllm.sh serve 8411`, whose dev mode allows emptying its prefix cache);
# it holds v0 already (the base), so petting only probes it (vllm.load_weights: false).
#
# Usage: scripts/bench/engines.sh VLLM_URL
set -euo pipefail
cd "$(dirname "$0")/../.."
url=${1:?usage: scripts/bench/engines.sh VLLM_URL}
cargo build --locked --quiet --bin petting
vllm=(--set rollout.engine=vllm --set "vllm.url=$url" --set vllm.load_weights=false)
for row in "math tree 8" "math independent 4" "plan-path tree 8"; do
    read -r workflow mode k <<<"$row"
    export K=$k TASKS=16 MAX_NEW=64
    scripts/bench/rollout.sh target/debug/petting models/smollm2-135m-instruct "$workflow" "$mode" tch
    # A rollout stage follows a weight update, which empties vLLM's prefix cache: start
    # each row empty too, or the prompts an earlier row sampled come free.
    curl -sf -X POST "$url/reset_prefix_cache" > /dev/null
    scripts/bench/rollout.sh target/debug/petting models/smollm2-135m-instruct "$workflow" "$mode" vllm "${vllm[@]}"
done
