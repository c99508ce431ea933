#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs libtorch and the Python tools the
# tests compare against (each once, cached in ignored folders), then runs every test.
# Extra arguments go to `cargo test` (e.g. scripts/test.sh store::).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-libtorch.sh
scripts/install-python-tools.sh
scripts/install-test-models.sh
export PETTING_PYTHON="$PWD/.venv/bin/python"

cargo test --locked "$@"
