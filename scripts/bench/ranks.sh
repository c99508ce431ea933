#!/usr/bin/env bash
# Data-parallel updates against one process, side by side in one run (BENCHMARKS.md,
# "Ranks"): for each run file, one committed batch (the run up to its first update) is
# updated by one process on every core and by 2 ranks of one thread each, and a
# per-role team by 2 ranks one policy after the other and in two pools side by side.
# Prints each update's median step time, all-reduce bytes and seconds (from `updates`),
# and the largest difference between the weights the two wrote.
#
#   scripts/bench/ranks.sh [WORK_DIR [models|team]]   # default: a temporary folder, both
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/install/machine-cache.sh
# The binary the README's commands build: the model's work is libtorch's either way.
cargo build --locked --quiet --bin petting
petting="$PWD/target/debug/petting"
work="${1:-$(mktemp -d)}"
parts="${2:-models team}"
mkdir -p "$work"
quick=(--set evaluation.at_start=false --until update:0)

# The run up to its first update, then one copy per way of updating it.
prepare() { # NAME FILE [--set ...]
    local name="$1" file="$2"
    shift 2
    rm -rf "$work/$name"
    "$petting" --quiet pipeline run "$file" --set "store=$work/$name/base" "${quick[@]}" "$@" >/dev/null
}
update() { # NAME COPY [petting stage update options]
    local name="$1" copy="$2"
    shift 2
    rm -rf "$work/$name/$copy"
    cp -r "$work/$name/base" "$work/$name/$copy"
    local started="$EPOCHREALTIME"
    "$petting" --quiet stage update "$work/$name/$copy" --iteration 0 "$@" >/dev/null
    awk "BEGIN { printf \"%.2f\", $EPOCHREALTIME - $started }" > "$work/$name/$copy.wall"
}
report() { # NAME COPY
    "$petting" sql "$work/$1/$2" --format csv \
        "select '$1' as run, '$2' as update, count(*) as steps, median(seconds) as step_s, \
                $(cat "$work/$1/$2.wall") as wall_s, median(allreduce_bytes) as allreduce_bytes, \
                median(allreduce_seconds) as allreduce_s from updates where mode = 'ppo'" | tail -n 1
}
largest_difference() { # NAME COPY COPY
    .vllm/bin/python - "$work/$1/$2" "$work/$1/$3" <<'PY'
import glob, sys
import numpy as np
from safetensors.numpy import load_file
a_run, b_run = sys.argv[1:]
largest = 0.0
for a in sorted(glob.glob(f"{a_run}/checkpoints/*/v000001.*/*.safetensors")):
    if a.endswith("optimizer.safetensors"):
        continue
    policy, name = a.split("/")[-3], a.split("/")[-1]
    (b,) = glob.glob(f"{b_run}/checkpoints/{policy}/v000001.*/{name}")
    x, y = load_file(a), load_file(b)
    for key in x:
        largest = max(largest, float(np.abs(x[key].astype(np.float64) - y[key].astype(np.float64)).max()))
print(f"{largest:.3e}")
PY
}

echo "run,update,steps,step_s,wall_s,allreduce_bytes,allreduce_s"
[[ " $parts " == *" models "* ]] && for pair in "plan-path:pipelines/plan-path.yaml" "smollm2-full:pipelines/math.yaml" "smollm2-lora:pipelines/math-lora.yaml"; do
    name="${pair%%:*}"
    prepare "$name" "${pair#*:}"
    OMP_NUM_THREADS=2 update "$name" one
    update "$name" ranks --ranks 2
    OMP_NUM_THREADS=1 update "$name" one-thread
    report "$name" one
    report "$name" ranks
    echo "# $name: largest difference, 2 ranks vs one process: $(largest_difference "$name" one ranks);" \
        "vs one process on one thread: $(largest_difference "$name" one-thread ranks)"
done

[[ " $parts " == *" team "* ]] || exit 0
# A per-role team of two SmolLM2-135M: each policy data-parallel over both ranks, one
# after the other, against each in a pool of one rank, side by side (the rollouts are
# the same).
team=pipelines/math-per-role.yaml
pools=(--set pools.reasoner.ranks=1 --set pools.tool.ranks=1 --set policies.reasoner.pool=reasoner
    --set policies.tool.pool=tool)
prepare team "$team"
prepare team-pools "$team" "${pools[@]}"
update team in-turn --ranks 2
update team-pools side-by-side --ranks 2
OMP_NUM_THREADS=2 update team one
report team one
report team in-turn
report team-pools side-by-side
