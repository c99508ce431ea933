#!/usr/bin/env bash
# The Hanabi row of BENCHMARKS.md: one evaluation episode of pipelines/hanabi.yaml
# (on MODEL, default SmolLM2-135M-Instruct; 2 players, MAX_TURNS moves each, 24 new
# tokens a move) with
# TextArena's whole history in every prompt (history: full) and with the rules and the
# latest messages only (history: latest), one after the other, PAIRS times. Prints per
# run: model calls, prompt tokens prefilled, tokens generated, the evaluate stage's
# seconds (or why it stopped) and the sampler's prefill and decode seconds (from its
# `generated` log lines).
#
# Usage: scripts/bench/hanabi-history.sh   (MAX_TURNS: default 6; PAIRS: default 3;
#   MODEL: a model folder, default models/smollm2-135m-instruct)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -z "${PETTING:-}" ]]; then cargo build --locked --quiet --bin petting; fi
bin=$(realpath "${PETTING:-target/debug/petting}")
model=$(realpath "${MODEL:-models/smollm2-135m-instruct}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for pair in $(seq "${PAIRS:-3}"); do
    for history in full latest; do
        # A run that stops (a prompt over the limit) still prints what it sampled.
        { "$bin" pipeline run pipelines/hanabi.yaml --set "store=$work/$history-$pair" --set seed=7 \
            --set iterations=0 --set data.train_tasks=8 --set data.test_tasks=1 --set evaluation.tasks=1 \
            --set evaluation.samples=1 --set "workflow.max_turns=${MAX_TURNS:-6}" --set "env.history=$history" \
            --set "policies.shared.model=$model" -v 2>&1 ||
            true; } |
            awk -v history="$history" '
                /generated policy/ {
                    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] += kv[2] }
                    calls++
                }
                /^evaluate of iteration 0:/ { stage = $(NF - 4) }
                /^  caused by:/ { stage = "stopped:" substr($0, 14, 60) }
                END {
                    printf "%-6s calls %d prefill_tokens %d generated %d evaluate_s %s prefill_s %.1f decode_s %.1f\n",
                        history, calls, v["prefill_tokens"], v["generated_tokens"], stage, v["prefill_seconds"], v["decode_seconds"]
                }'
    done
done
