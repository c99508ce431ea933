#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs libtorch, the Python tools the tests
# compare against, vLLM's CPU server and MLflow's tracking server (each once, cached in
# ignored folders) and Debian's Chromium for the dashboard's tests, starts an S3-compatible
# server and a vLLM server on 127.0.0.1 for the tests that need them, then runs every test.
# Extra arguments go to `cargo test` (e.g. scripts/test.sh store::).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install/machine-cache.sh

# The suite's runs write real checkpoints (Qwen2.5-Coder-0.5B's is 2 GB) into temporary
# folders: it peaked at 6.5 GB on 2026-11-26. Without room the tests fail late, on a write,
# as if the code were wrong; say so before anything is built.
need_gib=10
free_gib=$(($(df --output=avail -k "${TMPDIR:-/tmp}" | tail -n 1) / 1024 / 1024))
if ((free_gib < need_gib)); then
    echo "error: ${TMPDIR:-/tmp} has $free_gib GiB free; the test suite needs $need_gib GiB" \
        "(its runs write real model checkpoints). Free some space or set TMPDIR." >&2
    exit 1
fi

scripts/install/libtorch.sh
scripts/install/python-tools.sh
scripts/install/test-models.sh
scripts/install/vllm.sh
scripts/install/mlflow.sh
scripts/install/wandb.sh
scripts/install/chromium.sh
export PETTING_PYTHON="$PWD/.venv/bin/python" PETTING_MLFLOW_PYTHON="$PWD/.mlflow/bin/python" \
    PETTING_WANDB_PYTHON="$PWD/.wandb/bin/python"

# The real models of the shipped pipelines, which the tests run; the vLLM server serves
# SmolLM2 and the full-weight test reloads an untied copy (see scripts/install/untie-embeddings.py).
scripts/install/models.sh
cargo build --locked --bin petting
smollm2=models/smollm2-135m-instruct
if [[ ! -f .models/smollm2-135m-instruct-untied/model.safetensors ]]; then
    .vllm/bin/python scripts/install/untie-embeddings.py "$smollm2" .models/smollm2-135m-instruct-untied
fi

eval "$(scripts/servers/s3.sh start)"
eval "$(scripts/servers/vllm.sh start)"
# The checkpoints the tests' runs cache (petting's cache_root) go in a folder of this
# suite's own: under /tmp they would pile up, a few GB a suite, until the disk is full.
XDG_CACHE_HOME="$(mktemp -d "${TMPDIR:-/tmp}/petting-test-cache.XXXXXX")"
export XDG_CACHE_HOME
trap 'scripts/servers/s3.sh stop; scripts/servers/vllm.sh stop; rm -rf "$XDG_CACHE_HOME"' EXIT
export PETTING_REQUIRE_S3=1 PETTING_REQUIRE_VLLM=1 PETTING_REQUIRE_BROWSER=1 PETTING_FULL_SUITE=1

status=0
cargo test --locked "$@" || status=$?
if ((status != 0)); then
    # The tests see only the S3 server's status codes; its own reasons are in its log.
    echo "S3 test server, last errors:" >&2
    scripts/servers/s3.sh errors >&2 || true
    echo "vLLM test server log: $PETTING_TEST_VLLM_LOG" >&2
fi
exit "$status"
