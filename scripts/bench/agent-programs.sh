#!/usr/bin/env bash
# The agent-program row of BENCHMARKS.md: the same prompts sampled by the built-in
# rollout and through the OpenAI-compatible endpoint by agent programs, one after the
# other, on one model. The built-in run is math's single-agent workflow (TASKS tasks, K
# independent episodes, MAX_NEW new tokens, TEMPERATURE); its prompts become the tasks
# of scripts/bench/one_call.py, which sends each as its one call, K episodes per task,
# all programs at once. Prints one line per run: rows, sampled tokens, the rollout
# stage's wall time and tokens per second of it.
#
# Usage: scripts/bench/agent-programs.sh [MODEL_DIR]   (default models/smollm2-135m-instruct)
#   TASKS, K, MAX_NEW: default 16, 4, 64; TEMPERATURE: default 0 (greedy: both sides then
#   sample the same tokens, the same work)
set -euo pipefail
cd "$(dirname "$0")/../.."
model=$(realpath "${1:-models/smollm2-135m-instruct}")
tasks=${TASKS:-16}; k=${K:-4}; max_new=${MAX_NEW:-64}
# PETTING: the binary to measure (default: petting built here, dev profile).
if [[ -z "${PETTING:-}" ]]; then cargo build --locked --quiet --bin petting; fi
bin=$(realpath "${PETTING:-target/debug/petting}")
work=$(mktemp -d)
trap '[[ -n "${KEEP:-}" ]] || rm -rf "$work"' EXIT
common="seed: 7
iterations: 1
policies: {shared: {model: $model}}
algorithm: {name: grpo}
evaluation: {tasks: 1, modes: [multi_agent], sampling: {max_new_tokens: 4}}"
cat > "$work/builtin.yaml" <<YAML
store: $work/builtin
$common
env: {name: math}
workflow: {kind: single_agent, max_turns: 1}
agents: {agent: {policy: shared}}
data:
  train_tasks: $tasks
  test_tasks: 1
  train_file: {path: $PWD/datasets/math/gsm_symbolic.jsonl, columns: {problem: problem, answer: answer}}
  test_file: {path: $PWD/datasets/math/champ.jsonl, columns: {problem: problem, answer: answer}}
rollout: {mode: independent, episodes_per_task: $k, tasks_per_iteration: $tasks, sampling: {temperature: ${TEMPERATURE:-0}, max_new_tokens: $max_new}}
YAML
measure() {  # run file, label: the rollout stage alone, timed
    "$bin" pipeline run "$1" --until rollout:0 > "$work/$2-setup.log" 2>&1 || { cat "$work/$2-setup.log" >&2; exit 1; }
    local store; store=$(awk '/^store:/ {print $2}' "$1")
    local started; started=$(date +%s.%N)
    "$bin" stage rollout "$store" --iteration 0 > "$work/$2.log" 2>&1 || { cat "$work/$2.log" >&2; exit 1; }
    local wall; wall=$(echo "$(date +%s.%N) - $started" | bc -l)
    local rows generated
    rows=$("$bin" sql "$store" "SELECT count(*) FROM turns" --format csv | tail -1)
    generated=$("$bin" sql "$store" "SELECT sum(cardinality(response_tokens)) FROM turns" --format csv | tail -1)
    printf '%-10s rows %4s  tokens %6s  stage %6.1f s  %6.1f tok/s\n' "$2" "$rows" "$generated" "$wall" "$(echo "$generated/$wall" | bc -l)"
}
measure "$work/builtin.yaml" built-in
"$bin" sql "$work/builtin" "SELECT DISTINCT task_id AS id, prompt_message AS prompt FROM turns ORDER BY 1" \
    --format json | python3 -c 'import json, sys; [print(json.dumps(r)) for r in json.load(sys.stdin)]' > "$work/prompts.jsonl"
echo '{"id": "test", "prompt": "What is 1 + 1?"}' > "$work/test.jsonl"
cat > "$work/programs.yaml" <<YAML
store: $work/programs
$common
env: {name: agent_program, command: [python, $PWD/scripts/bench/one_call.py], concurrency: $((tasks * k))}
agents: {agent: {policy: shared}}
data: {train_tasks: $tasks, test_tasks: 1, train_file: {path: $work/prompts.jsonl}, test_file: {path: $work/test.jsonl}}
rollout: {mode: independent, episodes_per_task: $k, tasks_per_iteration: $tasks, sampling: {temperature: ${TEMPERATURE:-0}, max_new_tokens: $max_new}}
YAML
measure "$work/programs.yaml" programs
