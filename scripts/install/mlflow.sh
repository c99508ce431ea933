#!/usr/bin/env bash
# Installs MLflow's tracking server and client (PyPI's mlflow) into the ignored folder
# .mlflow/, for the test of `tracking.mlflow`. A venv of its own: mlflow pins pyarrow
# below the version the other test tools need. Idempotent: redone only when the pin
# changes.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$(readlink -f "$root/.mlflow")"  # the machine cache, where .mlflow links to it
pins="mlflow==3.17.2"
stamp="$venv/.petting-pins"

if [[ -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$pins" ]]; then
    exit 0
fi
echo "install-mlflow: creating $venv" >&2
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: $pins
echo "$pins" >"$stamp"
