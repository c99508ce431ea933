#!/usr/bin/env bash
# Runs the rows of RESULTS.md for one task and some seeds, each into runs/results/:
#
#   scripts/results.sh plan-path 1 2 3      # or sudoku, sokoban
#
# Per seed: the team with a shared policy trained with AT-GRPO (its v0 evaluations are
# the untrained rows), the same team trained with plain GRPO forked from that run's v0 (the
# same warm-started weights), the single agent, and the team with a full model per role.
# Every run resumes where it stopped, so the script can be interrupted and started again.
# PETTING selects the binary (default: target/release/petting).
set -euo pipefail
cd "$(dirname "$0")/.."
task=$1
shift
petting=${PETTING:-target/release/petting}
mkdir -p runs/results/logs
run() {
    local name=$1
    shift
    echo "== $name: $(date -Is)"
    "$petting" pipeline run "$@" --set store="../runs/results/$name" >"runs/results/logs/$name.log" 2>&1 \
        || { echo "$name failed; see runs/results/logs/$name.log"; return 1; }
    tail -n 1 "runs/results/logs/$name.log"
}
for seed in "$@"; do
    run "$task-s$seed" "pipelines/$task.yaml" --set seed="$seed"
    run "$task-grpo-s$seed" "pipelines/$task-grpo.yaml" --set seed="$seed" --from "runs/results/$task-s$seed@0"
    run "$task-single-agent-s$seed" "pipelines/$task-single-agent.yaml" --set seed="$seed"
    run "$task-per-role-s$seed" "pipelines/$task-per-role.yaml" --set seed="$seed"
done
