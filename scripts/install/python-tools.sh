#!/usr/bin/env bash
# Creates .venv/ with the Python packages tests use as independent references
# (pyarrow reads our Parquet). Idempotent: redone only when the requirements change.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
requirements="$root/scripts/install/requirements-test.txt"
venv="$(readlink -f "$root/.venv")"  # the machine cache, where .venv links to it
stamp="$venv/.petting-requirements"

if [[ -f "$stamp" ]] && cmp -s "$stamp" "$requirements"; then
    exit 0
fi
echo "install-python-tools: creating $venv" >&2
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: -r "$requirements"
cp "$requirements" "$stamp"
