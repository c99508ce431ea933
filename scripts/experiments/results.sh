#!/usr/bin/env bash
# Runs the rows of RESULTS.md for one task and some seeds, each into runs/results/:
#
#   scripts/experiments/results.sh plan-path 1 2 3      # or sudoku, sokoban, math, code, tic-tac-toe-smollm2
#
# Per seed: the team with a shared policy trained with AT-GRPO (its version 0 gives the
# untrained "MAS" row); the team trained with plain GRPO; with PPO and a learned critic,
# independent (ppo) or centralised (mappo); where the pipelines exist
# (pipelines/<task>-<row>.yaml), with a league of past selves (tic-tac-toe), with a full
# model per role (L2), with a LoRA adapter per role (L1), with each agent trained alone
# (the paper's "train in single agent, evaluate in MAS"), and the single agent. A task
# that warm-starts its model (the grid tasks) forks every team row from the shared run's
# version 0, so all start on the same warm-started weights; a pretrained model (math,
# code, tic-tac-toe) is that same start already.
# Every run resumes where it stopped, so the script can be interrupted and started
# again. PETTING selects the binary; ROWS (e.g. "ppo mappo") runs only those rows beside
# the shared run. A row staleN (ROWS="stale1 stale2", not run by default) is the shared
# run's file with rollout.max_staleness N: sampling beside training.
set -euo pipefail
cd "$(dirname "$0")/../.."
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
    from=()
    if grep -q '^warm_start:' "pipelines/$task.yaml"; then
        from=(--from "runs/results/$task-s$seed@0")
    fi
    run "$task-s$seed" "pipelines/$task.yaml" --set seed="$seed"
    for row in ${ROWS:-grpo ppo mappo returns league per-role lora alone single-agent}; do
        if [[ $row =~ ^stale([0-9]+)$ ]]; then
            run "$task-$row-s$seed" "pipelines/$task.yaml" --set seed="$seed" \
                --set rollout.max_staleness="${BASH_REMATCH[1]}" "${from[@]}"
            continue
        fi
        [[ -f "pipelines/$task-$row.yaml" ]] || continue
        fork=("${from[@]}")
        if [[ $row == single-agent ]]; then
            fork=()  # not a team: it warm-starts on its own demonstrations
        fi
        run "$task-$row-s$seed" "pipelines/$task-$row.yaml" --set seed="$seed" "${fork[@]}"
    done
done
