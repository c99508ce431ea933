#!/usr/bin/env bash
# Resident memory of `petting pipeline run` across its stages: the shipped code pipeline
# on Qwen2.5-Coder-0.5B (full weights), shrunk to 4 tasks × K = 4 and 192 new tokens,
# run until iteration 1's rollout is committed, with the process's VmRSS sampled every
# 2 s. Writes bench-results/pipeline-memory/LABEL.log (the run's output: each committed
# stage with its seconds and the run's total) and LABEL.rss (seconds since start, RSS in
# KiB). The same seed samples the same tokens with any binary, so two binaries'
# rollouts compare token for token.
#
# Usage: scripts/bench/pipeline-memory.sh BINARY LABEL
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "$1"); label=$2
out="$PWD/bench-results/pipeline-memory"
mkdir -p "$out"
store=$(mktemp -d)/run
trap 'rm -rf "$(dirname "$store")"' EXIT
start=$(date +%s.%N)
since() { echo "$(date +%s.%N) - $start" | bc; }

cd pipelines
"$bin" pipeline run code.yaml --set "store=$store" --set iterations=3 \
    --set rollout.tasks_per_iteration=4 --set rollout.sampling.max_new_tokens=192 \
    --set algorithm.filter.drop_degenerate=false --set evaluation.at_start=false \
    --set evaluation.every=100 --set seed=5 --until update:1 >"$out/$label.log" 2>&1 &
pid=$!
: >"$out/$label.rss"
while kill -0 "$pid" 2>/dev/null; do
    printf '%.1f %s\n' "$(since)" "$(awk '/VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null)" >>"$out/$label.rss"
    sleep 2
done
wait "$pid"
echo "$label: $out/$label.log, $out/$label.rss"
