#!/usr/bin/env bash
# Checks a CUDA build of petting on a GPU against its own CPU path: trains the embedded
# default for one iteration on the GPU (float32), then scores 64 of its sampled turns with
# the committed version-0 weights on the CPU and on the GPU, and prints the largest
# per-token logprob difference between CPU, GPU and the sampler that drew them.
#
# Usage: scripts/experiments/check-cuda.sh PETTING [DIR]   (DIR: where the run goes, default a temp folder)
set -euo pipefail
cd "$(dirname "$0")/../.."
petting=${1:?usage: scripts/experiments/check-cuda.sh PETTING [DIR]}
dir=${2:-$(mktemp -d)}
run="$dir/run"
gpu=${GPU:-cuda}   # GPU=cpu runs the same steps without one

"$petting" pipeline run pipelines/plan-path.yaml --set store="$run" --set iterations=1 \
    --set policies.shared.device="$gpu" --set policies.shared.dtype=f32 --set evaluation.every=1 | tail -n 3
"$petting" sql "$run" --format json --output "$dir/turns.json" \
    "select prompt_tokens as prompt_ids, response_tokens as response_ids, response_logprobs
     from turns where iteration = 0 and cardinality(response_tokens) > 0 order by candidate_id limit 64"
python3 -c "import json, sys; [print(json.dumps(r)) for r in json.load(open(sys.argv[1]))]" \
    "$dir/turns.json" > "$dir/requests.jsonl"
v0=$(ls -d "$run"/checkpoints/shared/v000000.*)
for device in cpu "$gpu"; do
    "$petting" model score "$v0" --device "$device" --dtype f32 --input "$dir/requests.jsonl" > "$dir/$device.jsonl"
done
python3 - "$dir" "$gpu" <<'PY'
import json, sys
d = sys.argv[1]
gpu = sys.argv[2]
rows = {n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")] for n in ("cpu", gpu)}
def gap(a, b):
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
cpu, cuda = [r["logprobs"] for r in rows["cpu"]], [r["logprobs"] for r in rows[gpu]]
sampled = [r["response_logprobs"] for r in rows["cpu"]]
tokens = sum(len(r) for r in cpu)
print(json.dumps({"rows": len(cpu), "tokens": tokens, "max_gap_cpu_cuda": gap(cpu, cuda),
                  "max_gap_cuda_sampler": gap(cuda, sampled), "max_gap_cpu_sampler": gap(cpu, sampled)}))
PY
