#!/usr/bin/env bash
# The main job: the embedded default (Plan-Path 10x10, tool agent + planner, AT-GRPO),
# built and trained on this machine with nothing downloaded but libtorch.
# Extra arguments go to `petting pipeline run`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install/machine-cache.sh

scripts/install/libtorch.sh
if [[ ! -x target/debug/petting ]]; then
    echo "run-default: building petting and its dependencies (about 28 minutes on 2 cores the first time, seconds after)" >&2
fi
cargo run --locked -- pipeline run pipelines/plan-path.yaml "$@"
