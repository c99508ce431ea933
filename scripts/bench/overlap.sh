#!/usr/bin/env bash
# Sampling beside training against taking turns (BENCHMARKS.md, "Sampling beside training"):
# the same run file three ways, modes alternating REPEATS times:
#   one-process  strictly on-policy, one process on both cores (what `pipeline run` does);
#   lanes-s0     strictly on-policy as two lanes, the train lane pinned to core 0 and the
#                sample lane to core 1 (taskset, one libtorch thread each);
#   lanes-sS     the same lanes with rollout.max_staleness S (STALENESS, default 1).
# The two lane modes have the same hardware, so only the waits differ; one-process says
# what the lanes cost against giving each stage both cores. Prints, per run, the wall time
# of the iterations (from version 0's commit to the last update's) and the summed rollout
# and training (group + advantage + update) seconds, from `commits`. Every run forks one
# base (prepare-data and version 0, the warm start included), so that runs once, unmeasured.
#
#   scripts/bench/overlap.sh [RUN_FILE [ITERATIONS [--set KEY=VALUE ...]]]   # default pipelines/plan-path.yaml, 10
#   REPEATS (default 3), STALENESS (default 1), MODES (default all three), WORK (default: a
#   temporary folder)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/install/machine-cache.sh
cargo build --locked --quiet --bin petting
petting="$PWD/target/debug/petting"
file="${1:-pipelines/plan-path.yaml}"
iterations="${2:-10}"
staleness="${STALENESS:-1}"
work="${WORK:-$(mktemp -d)}"
mkdir -p "$work"
# One evaluation, after the last update: outside the measured span in every mode.
sets=(--set "iterations=$iterations" --set evaluation.at_start=false --set "evaluation.every=$iterations" "${@:3}")

base="$work/base"
[ -d "$base" ] || "$petting" --quiet pipeline run "$file" "${sets[@]}" --set "store=$base" --until rollout:0 >&2

run() { # STORE MODE
    local store="$1" mode="$2" s=0
    [[ $mode == lanes-s0 || $mode == one-process ]] || s=$staleness
    local args=(pipeline run "$file" "${sets[@]}" --set "store=$store" --set "rollout.max_staleness=$s")
    # The fork's own data and version 0 first, so both lanes start on a committed run.
    "$petting" --quiet "${args[@]}" --from "$base@0" --until rollout:0 >&2
    if [[ $mode == one-process ]]; then
        OMP_NUM_THREADS=2 "$petting" --quiet "${args[@]}" >/dev/null
        return
    fi
    OMP_NUM_THREADS=1 taskset -c 1 "$petting" --quiet "${args[@]}" --lane sample >/dev/null &
    local sample=$!
    OMP_NUM_THREADS=1 taskset -c 0 "$petting" --quiet "${args[@]}" --lane train >/dev/null
    wait "$sample"
}

report() { # STORE MODE REPEAT
    "$petting" sql "$1" --format csv \
        "with t as (select stage, iteration, seconds, cast(finished_at as bigint) / 1e6 as finished from commits) \
         select '$2' as mode, $3 as repeat, \
                round(max(case when stage = 'update' and iteration is not null then finished end) \
                      - max(case when stage = 'update' and iteration is null then finished end), 1) as iterations_s, \
                round(sum(case when stage = 'rollout' then seconds end), 1) as rollout_s, \
                round(sum(case when stage in ('group', 'advantage', 'update') and iteration is not null \
                               then seconds end), 1) as train_s \
         from t" | tail -n +2
}

echo "mode,repeat,iterations_s,rollout_s,train_s"
for repeat in $(seq 1 "${REPEATS:-3}"); do
    for mode in ${MODES:-one-process lanes-s0 lanes-s$staleness}; do
        store="$work/$mode-r$repeat"
        rm -rf "$store"
        run "$store" "$mode"
        report "$store" "$mode" "$repeat"
    done
done
