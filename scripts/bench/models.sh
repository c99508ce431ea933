#!/usr/bin/env bash
# The model benchmarks of ../shared/bench/ANCHORS.md, petting (tch, benches/model.rs) and
# Hugging Face transformers (the anchor scripts) side by side: for each workload, ours then
# theirs, each process gated on an idle machine (the anchors' wait_quiet.py), 1 warm-up +
# 5 timed reps, reps disturbed by a neighbour redone. Results append as JSON lines to
# $RESULTS (default bench-results/models.jsonl).
#
# Usage: PY=/path/to/pyref/bin/python scripts/bench/models.sh MODEL [WORKLOAD...]
#   MODEL: bench-tiny | bench-small; WORKLOAD: prefill greedy sampled ce ppo (default: all)
#   PY: the python of ../shared/bench/anchors/setup-pyref.sh DIR (TORCH_VERSION=2.11.0);
#       without it only petting's side runs. Set GLIBC_TUNABLES to compare under the
#       glibc variant ANCHORS.md describes (it applies to both sides).
#   PROFILE: the cargo profile petting's side is built with (default bench, i.e. release;
#       PROFILE=dev reuses the build the tests and the main command use).
#   ROUNDS: run every (petting, transformers) pair this many times, alternating, so that
#       a machine whose speed drifts over minutes slows both sides alike (default 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:?usage: scripts/bench/models.sh bench-tiny|bench-small [workload...]}
shift
workloads=("$@")
[[ ${#workloads[@]} -gt 0 ]] || workloads=(prefill greedy sampled ce ppo)
anchors="$PWD/../shared/bench/anchors"
results=${RESULTS:-$PWD/bench-results/models.jsonl}
mkdir -p "$(dirname "$results")"
export OMP_NUM_THREADS=2 ANCHOR_THREADS=2 TOKENIZERS_PARALLELISM=false
tag=${GLIBC_TUNABLES:+glibc-nommap}
tag=${tag:-default}

profile=${PROFILE:-bench}
cargo bench --profile "$profile" --bench model --no-run --quiet
quiet() { if [[ -n "${PY:-}" ]]; then (cd "$anchors" && "$PY" wait_quiet.py); fi; }
for round in $(seq 1 "${ROUNDS:-1}"); do
    for w in "${workloads[@]}"; do
        quiet
        echo "=== $(date +%T) round $round: petting $model $w" >&2
        cargo bench --profile "$profile" --quiet --bench model -- --model "$model" --workload "$w" --out "$results" --tag "$tag"
        if [[ "$w" == prefill ]]; then
            quiet
            cargo bench --profile "$profile" --quiet --bench model -- --model "$model" --workload prefill_keep1 --out "$results" --tag "$tag"
        fi
        [[ -n "${PY:-}" ]] || continue
        quiet
        echo "=== $(date +%T) round $round: transformers $model $w" >&2
        case "$w" in
            prefill|greedy|sampled) (cd "$anchors" && "$PY" bench_generate.py --model "$model" --mode "$w" --out "$results" --tag "$tag") ;;
            ce|ppo) (cd "$anchors" && "$PY" bench_train.py --model "$model" --loss "$w" --out "$results" --tag "$tag") ;;
        esac
    done
done
