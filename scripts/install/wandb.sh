#!/usr/bin/env bash
# Installs W&B's client (PyPI's wandb) into the ignored folder .wandb/, for the test of
# `tracking.wandb`: its own reader of offline runs reads the files petting writes. A venv
# of its own, as MLflow's. Idempotent: redone only when the pin changes.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$(readlink -f "$root/.wandb")"  # the machine cache, where .wandb links to it
pins="wandb==0.31.0"
stamp="$venv/.petting-pins"

if [[ -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$pins" ]]; then
    exit 0
fi
echo "install-wandb: creating $venv" >&2
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: $pins
echo "$pins" >"$stamp"
