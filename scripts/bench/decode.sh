#!/usr/bin/env bash
# bf16 decode on a GPU, petting's sampler (benches/model.rs --workload decode) then Hugging
# Face generate (scripts/bench/decode_hf.py) on the same shape, random weights, prompts and
# batch, one process each; a GPU's used memory is sampled every 100 ms by nvidia-smi while
# each runs (the whole process: weights, caches, allocator reserve).
#
# Usage: scripts/bench/decode.sh BENCH_BINARY [CONFIG BATCH PROMPT NEW]
#   BENCH_BINARY: the bench target built against the CUDA libtorch, e.g.
#     LIBTORCH=$PWD/.libtorch-cuda cargo build --target-dir target-cuda --bench model
#     (target-cuda/debug/deps/model-<hash>); PY: the python with torch + transformers.
set -euo pipefail
cd "$(dirname "$0")/../.."
bench=${1:?usage: scripts/bench/decode.sh BENCH_BINARY [CONFIG BATCH PROMPT NEW]}
config=${2:-benches/configs/qwen3-1.7b.config.json}
batch=${3:-64} prompt=${4:-256} new=${5:-128}
py=${PY:-python3}

peak_memory() { # runs "$@", then prints the GPU's peak used MiB during it
    local log
    log=$(mktemp)
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$log" &
    local sampler=$!
    "$@"
    kill "$sampler"
    echo "{\"peak_gpu_used_mib\": $(sort -n "$log" | tail -n 1)}"
    rm -f "$log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
peak_memory "$bench" --config "$config" --device cuda --dtype bf16 --workload decode \
    --batch "$batch" --prompt-len "$prompt" --new-tokens "$new" --reps 5
peak_memory "$py" scripts/bench/decode_hf.py "$config" "$batch" "$prompt" "$new" 5
