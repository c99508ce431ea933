#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs libtorch and the Python tools the
# tests compare against (each once, cached in ignored folders), starts an S3-compatible
# server on 127.0.0.1 for the store tests, then runs every test.
# Extra arguments go to `cargo test` (e.g. scripts/test.sh store::).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-libtorch.sh
scripts/install-python-tools.sh
scripts/install-test-models.sh
export PETTING_PYTHON="$PWD/.venv/bin/python"

eval "$(scripts/s3-test-server.sh start)"
trap 'scripts/s3-test-server.sh stop' EXIT
export PETTING_REQUIRE_S3=1

status=0
cargo test --locked "$@" || status=$?
if ((status != 0)); then
    # The tests see only the S3 server's status codes; its own reasons are in its log.
    echo "S3 test server, last errors:" >&2
    scripts/s3-test-server.sh errors >&2 || true
fi
exit "$status"
