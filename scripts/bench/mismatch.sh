#!/usr/bin/env bash
# The sampler/trainer mismatch table of BENCHMARKS.md: one math rollout (16 tasks, K = 4,
# 128 new tokens, temperature 1) sampled by the tch sampler or by a vLLM server, then one
# update whose single step per policy records, over every sampled token, the share whose
# ratio π_trainer / π_sampler lies outside [0.9, 1.1] (`updates.mismatch_fraction`) and
# the 95th percentile of |Δ logprob| (`updates.mismatch_p95`). Rows: SmolLM2-135M-Instruct
# and Qwen2.5-Coder-0.5B-Instruct, the sampler and the trainer in float32 or bf16.
# Each vLLM row starts its own server (scripts/servers/vllm.sh serve) on PORT.
#
# Usage: scripts/bench/mismatch.sh [PORT [MODEL...]]    (results: bench-results/mismatch.csv)
#   MODEL: folders under models/ (default: smollm2-135m-instruct qwen2.5-coder-0.5b-instruct)
set -euo pipefail
cd "$(dirname "$0")/../.."
port=${1:-8431}
shift || true
models=("$@")
((${#models[@]})) || models=(smollm2-135m-instruct qwen2.5-coder-0.5b-instruct)
cargo build --locked --quiet --bin petting
bin=target/debug/petting
out=bench-results/mismatch.csv
mkdir -p bench-results
[[ -f $out ]] || echo "model,sampler,sampler_dtype,trainer_dtype,tokens,outside_band,p95_abs_dlogprob" > "$out"

row() {
    local model=$1 sampler=$2 sampler_dtype=$3 trainer_dtype=$4
    local work; work=$(mktemp -d)
    local args=(--set "store=$work/run" --set seed=7 --set iterations=1 --set data.train_tasks=16
        --set rollout.tasks_per_iteration=16 --set rollout.branches=4 --set workflow.max_turns=1
        --set rollout.sampling.temperature=1.0 --set rollout.sampling.max_new_tokens=128
        --set algorithm.filter.drop_degenerate=false --set update.mini_batch_sequences=1024
        --set evaluation.at_start=false --set evaluation.tasks=1
        --set "policies.shared.model=$PWD/models/$model" --set "policies.shared.dtype=$trainer_dtype")
    # bf16 logprobs are ~0.06 apart on the engine's weight probe (measured), more than
    # the default vllm.probe_tolerance and update.max_logprob_drift of 0.05.
    [[ $sampler_dtype == float32 && $trainer_dtype == f32 ]] || args+=(--set update.max_logprob_drift=0.5)
    local server=""
    if [[ $sampler == vllm ]]; then
        VLLM_DTYPE=$sampler_dtype scripts/servers/vllm.sh serve "$port" "$PWD/models/$model" \
            > "$work/vllm.log" 2>&1 &
        server=$!
        until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do
            kill -0 "$server" 2> /dev/null || { cat "$work/vllm.log" >&2; exit 1; }
            sleep 2
        done
        args+=(--set rollout.engine=vllm --set "vllm.url=http://127.0.0.1:$port" --set vllm.load_weights=false)
        [[ $sampler_dtype == float32 && $trainer_dtype == f32 ]] || args+=(--set vllm.probe_tolerance=0.5)
    fi
    # The server stops before the update: a 0.5B model's full fine-tuning and a vLLM
    # server holding it do not fit in 24 GiB together.
    "$bin" pipeline run pipelines/math-single-agent.yaml "${args[@]}" --until update:0 > "$work/run.log" 2>&1 \
        || { tail -5 "$work/run.log" >&2; }
    [[ -z $server ]] || { kill -- "-$server" 2> /dev/null || kill "$server"; wait "$server" 2> /dev/null || true; }
    "$bin" pipeline run pipelines/math-single-agent.yaml "${args[@]}" >> "$work/run.log" 2>&1 \
        || { tail -5 "$work/run.log" >&2; }
    local stats
    stats=$("$bin" sql "$work/run" "SELECT sum(tokens), sum(mismatch_fraction * tokens) / sum(tokens),
        max(mismatch_p95) FROM updates WHERE mode = 'ppo'" --format csv | tail -1)
    echo "$model,$sampler,$sampler_dtype,$trainer_dtype,$stats" | tee -a "$out"
    rm -rf "$work"
}

# ROWS (e.g. "vllm:bfloat16:bf16") limits the run to some rows.
rows=${ROWS:-"tch:float32:f32 tch:bfloat16:bf16 vllm:float32:f32 vllm:bfloat16:f32 vllm:bfloat16:bf16"}
for model in "${models[@]}"; do
    for r in $rows; do
        IFS=: read -r sampler sampler_dtype trainer_dtype <<<"$r"
        row "$model" "$sampler" "$sampler_dtype" "$trainer_dtype"
    done
done
