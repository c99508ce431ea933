#!/usr/bin/env bash
# One PPO update of a real model, measured: a math rollout of TASKS tasks × K candidates
# (both agents on one policy, 24 new tokens) is committed first, then the update stage
# runs alone under /usr/bin/time, so its peak RSS is the update's. Appends one JSON line
# to $RESULTS (default bench-results/update.jsonl). ALGORITHM (default at_grpo) and
# ROLLOUT=independent change the estimator and the sampling; with a critic (CRITIC=own or
# joint: PPO on independent episodes) the line also gives the advantage stage's seconds,
# where the critic values every turn, and the seconds of the heads' fit in the update;
# CRITIC_MODEL=FOLDER puts the heads on that separate critic model (critic.model).
#
# Usage: scripts/bench/update.sh BINARY MODEL_DIR lora|full f32|bf16 LABEL [--set KEY=VALUE...]
#   BINARY: a petting binary (e.g. target/debug/petting, or one built from an older commit)
#   TASKS, K: the rollout's tasks and group size (default 2 and 2)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "$1"); model=$(realpath "$2"); mode=$3; dtype=$4; label=$5; shift 5
results=${RESULTS:-$PWD/bench-results/update.jsonl}
mkdir -p "$(dirname "$results")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lora=""
[[ $mode == lora ]] && lora="lora: {rank: 8, alpha: 16.0},"
algorithm="algorithm: {name: ${ALGORITHM:-at_grpo}}"; independent=""
[[ ${ROLLOUT:-tree} == independent ]] && independent="mode: independent,"
if [[ -n ${CRITIC:-} ]]; then
    algorithm="algorithm: {name: ppo}
critic: {sees: $CRITIC${CRITIC_MODEL:+, model: $(realpath "$CRITIC_MODEL")}}"
    independent="mode: independent,"
fi
lr=1.0e-6
[[ $mode == lora ]] && lr=1.0e-4
cat > "$work/bench.yaml" <<YAML
store: $work/run
seed: 7
iterations: 1
env: {name: math, tool_timeout_seconds: 10}
data:
  train_tasks: 8
  test_tasks: 1
  train_file: {path: $PWD/datasets/math/gsm_symbolic.jsonl, columns: {problem: problem, answer: answer}}
  test_file: {path: $PWD/datasets/math/champ.jsonl, columns: {problem: problem, answer: answer}}
workflow: {kind: tool_reasoner, max_turns: 1}
agents: {tool: {policy: shared}, reasoner: {policy: shared}}
policies:
  shared: {model: $model, dtype: $dtype, $lora optimizer: {lr: $lr}}
rollout: {tasks_per_iteration: ${TASKS:-2}, k: ${K:-2}, $independent sampling: {temperature: 1.0, max_new_tokens: 24}}
$algorithm
update: {mini_batch_sequences: 1024}
evaluation: {tasks: 1, samples: 1, sampling: {max_new_tokens: 4}}
YAML
"$bin" pipeline run "$work/bench.yaml" --until update:0 "$@" > "$work/setup.log" 2>&1 || { cat "$work/setup.log" >&2; exit 1; }
status=ok
/usr/bin/time -v -o "$work/time" "$bin" stage update "$work/run" --iteration 0 > "$work/update.log" 2>&1 || status="failed: $(grep -v '^\s*$' "$work/update.log" | tail -1)"
rss_kib=$(awk -F': ' '/Maximum resident/ {print $2}' "$work/time")
wall=$(awk -F': ' '/Elapsed/ {print $2}' "$work/time")
tokens=$("$bin" sql "$work/run" "SELECT sum(cardinality(prompt_tokens) + cardinality(response_tokens)) FROM turns" --format csv | tail -1)
rows=$("$bin" sql "$work/run" "SELECT count(*) FROM turns" --format csv | tail -1)
advantage=$("$bin" sql "$work/run" "SELECT sum(seconds) FROM commits WHERE stage = 'advantage'" --format csv | tail -1)
step="null"; change="null"; critic="null"
if [[ $status == ok ]]; then
    step=$("$bin" sql "$work/run" "SELECT sum(seconds) FROM updates WHERE mode = 'ppo'" --format csv | tail -1)
    critic=$("$bin" sql "$work/run" "SELECT coalesce(sum(seconds), 0) FROM updates WHERE mode = 'critic'" --format csv | tail -1)
    change=$("$bin" sql "$work/run" "SELECT max(weights_change) FROM updates WHERE mode = 'ppo'" --format csv 2>/dev/null | tail -1) || change=null
    [[ -n $change ]] || change=null
fi
printf '{"label":"%s","model":"%s","mode":"%s","dtype":"%s","critic":"%s","rows":%s,"tokens":%s,"advantage_seconds":%s,"step_seconds":%s,"critic_seconds":%s,"stage_wall":"%s","peak_rss_gib":%.2f,"weights_change":%s,"status":"%s"}\n' \
    "$label" "$(basename "$model")" "$mode" "$dtype" "${CRITIC:-none}${CRITIC_MODEL:+ on $(basename "$CRITIC_MODEL")}" "$rows" "$tokens" "$advantage" "$step" "$critic" "$wall" "$(echo "$rss_kib/1048576" | bc -l)" "$change" "$status" | tee -a "$results"
