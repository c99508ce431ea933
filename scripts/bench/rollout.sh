#!/usr/bin/env bash
# One rollout of a real model, measured: TASKS tasks of the math or Plan-Path workflow
# (both agents on one policy, one turn, MAX_NEW new tokens, temperature 1), in tree mode
# (K candidates per node) or independent mode (K trajectories per task). The rollout
# stage runs alone under /usr/bin/time, so its peak RSS is the rollout's. Appends one
# JSON line to $RESULTS (default bench-results/rollout.jsonl) and writes the prompts it
# sampled, one JSON line per generate call, to bench-results/prompts-LABEL-....jsonl for
# scripts/bench_rollout_hf.py.
#
# Usage: scripts/bench/rollout.sh BINARY MODEL_DIR math|plan-path tree|independent LABEL [--set KEY=VALUE...]
#   BINARY: a petting binary (e.g. target/debug/petting, or one built from an older commit)
#   TASKS, K, MAX_NEW: tasks, candidates and new tokens (default 16, 8, 64)
#   WRAP: a command the rollout stage runs under, e.g. WRAP="perf record -g -o rollout.perf"
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "$1"); model=$(realpath "$2"); workflow=$3; mode=$4; label=$5; shift 5
results=${RESULTS:-$PWD/bench-results/rollout.jsonl}
mkdir -p "$(dirname "$results")" bench-results
tasks=${TASKS:-16}; k=${K:-8}; max_new=${MAX_NEW:-64}
work=$(mktemp -d)
trap '[[ -n "${KEEP:-}" ]] || rm -rf "$work"' EXIT
case $workflow in
    math) task_yaml="env: {name: math, tool_timeout_seconds: 10}
data:
  train_tasks: $tasks
  test_tasks: 1
  train_file: {path: $PWD/datasets/math/gsm_symbolic.jsonl, columns: {problem: problem, answer: answer}}
  test_file: {path: $PWD/datasets/math/champ.jsonl, columns: {problem: problem, answer: answer}}
workflow: {kind: tool_reasoner, max_turns: 1}
agents: {tool: {policy: shared}, reasoner: {policy: shared}}" ;;
    plan-path) task_yaml="env: {name: plan_path, size: 10, wall_probability: 0.22}
data: {train_tasks: $tasks, test_tasks: 1}
workflow: {kind: tool_planner, max_turns: 1}
agents: {tool: {policy: shared}, planner: {policy: shared}}" ;;
    *) echo "workflow: math or plan-path" >&2; exit 2 ;;
esac
cat > "$work/bench.yaml" <<YAML
store: $work/run
seed: 7
iterations: 1
$task_yaml
policies:
  shared: {model: $model}
rollout: {tasks_per_iteration: $tasks, k: $k, mode: $mode, sampling: {temperature: 1.0, max_new_tokens: $max_new}}
# The estimator does not change what a rollout samples; grpo groups by task, which
# independent episodes allow (at_grpo's per-turn groups need tree mode).
algorithm: {name: grpo}
evaluation: {tasks: 1, samples: 1, sampling: {max_new_tokens: 4}}
YAML
"$bin" pipeline run "$work/bench.yaml" --until rollout:0 "$@" > "$work/setup.log" 2>&1 || { cat "$work/setup.log" >&2; exit 1; }
status=ok
PETTING_LOG=petting::engine::responder=info /usr/bin/time -v -o "$work/time" \
    ${WRAP:-} "$bin" stage rollout "$work/run" --iteration 0 > "$work/rollout.log" 2>&1 \
    || status="failed: $(grep -v '^\s*$' "$work/rollout.log" | tail -1)"
rss_kib=$(awk -F': ' '/Maximum resident/ {print $2}' "$work/time")
wall=$(awk -F': ' '/Elapsed/ {print $2}' "$work/time")
sql() { "$bin" sql "$work/run" "$1" --format csv | tail -1; }
rows=$(sql "SELECT count(*) FROM turns")
generated=$(sql "SELECT sum(cardinality(response_tokens)) FROM turns")
model_seconds=$(sql "SELECT sum(model_seconds) FROM commits WHERE stage = 'rollout'")
# The sampler's own account (binaries from before it existed log nothing): times summed
# over its calls, slots and cache the largest of one call.
field() { grep -o " $1=[0-9.]*" "$work/rollout.log" | awk -F= '{s += $2} END {print (NR ? s : "null")}'; }
largest() { grep -o " $1=[0-9.]*" "$work/rollout.log" | awk -F= '$2 > m {m = $2} END {print (NR ? m : "null")}'; }
"$bin" sql "$work/run" "SELECT agent, prompt_tokens, cardinality(response_tokens) AS generated FROM turns ORDER BY agent, candidate_id" \
    --format json > "bench-results/prompts-$label-$(basename "$model")-$workflow-$mode.json"
printf '{"label":"%s","model":"%s","workflow":"%s","mode":"%s","k":%s,"rows":%s,"generated_tokens":%s,"stage_wall":"%s","model_seconds":%s,"tokens_per_second":%.1f,"peak_rss_gib":%.2f,"prefill_seconds":%s,"decode_seconds":%s,"tail_seconds":%s,"slots":%s,"kv_cache_mib":%s,"status":"%s"}\n' \
    "$label" "$(basename "$model")" "$workflow" "$mode" "$k" "$rows" "$generated" "$wall" "$model_seconds" \
    "$(echo "$generated/$model_seconds" | bc -l)" "$(echo "$rss_kib/1048576" | bc -l)" \
    "$(field prefill_seconds)" "$(field decode_seconds)" "$(field tail_seconds)" "$(largest slots)" "$(largest kv_cache_mib)" "$status" | tee -a "$results"
