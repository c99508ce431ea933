#!/usr/bin/env bash
# Runs the rows of RESULTS.md for one task and some seeds, each into runs/results/:
#
#   scripts/results.sh plan-path 1 2 3      # or sudoku, sokoban
#
# Per seed: the team with a shared policy trained with AT-GRPO (its version 0 gives the
# untrained "MAS" row); forked from that run's version 0, so on the same warm-started
# weights, the team trained with plain GRPO, with a full model per role (L2) and, where
# pipelines/<task>-lora.yaml exists, with a LoRA adapter per role (L1); where
# pipelines/<task>-alone.yaml exists, with each agent trained alone (the paper's "train in
# single agent, evaluate in MAS"); and the single agent, warm-started on its own
# demonstrations. Every run resumes where it stopped, so
# the script can be interrupted and started again. PETTING selects the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
task=$1
shift
petting=${PETTING:-target/release/petting}
mkdir -p runs/results-logs
run() {
    local name=$1
    shift
    echo "== $name: $(date -Is)"
    "$petting" pipeline run "$@" --set store="../runs/results/$name" >>"runs/results-logs/$name.log" 2>&1 \
        || { echo "$name failed; see runs/results-logs/$name.log"; return 1; }
    tail -n 1 "runs/results-logs/$name.log"
}
for seed in "$@"; do
    base="runs/results/$task-s$seed@0"
    run "$task-s$seed" "pipelines/$task.yaml" --set seed="$seed"
    run "$task-grpo-s$seed" "pipelines/$task-grpo.yaml" --set seed="$seed" --from "$base"
    run "$task-per-role-s$seed" "pipelines/$task-per-role.yaml" --set seed="$seed" --from "$base"
    for variant in lora alone; do
        if [[ -f "pipelines/$task-$variant.yaml" ]]; then
            run "$task-$variant-s$seed" "pipelines/$task-$variant.yaml" --set seed="$seed" --from "$base"
        fi
    done
    run "$task-single-agent-s$seed" "pipelines/$task-single-agent.yaml" --set seed="$seed"
done
