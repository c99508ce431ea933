"""Hugging Face `generate` on the prompts of one petting rollout (scripts/bench/rollout.sh).

Each agent's prompts are one `generate` call, as petting's rollout makes one call per
agent and turn: left-padded, sampled at temperature 1 (no top-k/top-p), the same number
of new tokens at most, float32, sdpa attention, 2 threads. Tokens/s counts each row's
tokens up to and including its EOS, as petting's `turns` do. Appends one JSON line.

Usage: python scripts/bench/rollout_hf.py PROMPTS_JSON MODEL_DIR MAX_NEW LABEL [RESULTS]
"""

import json
import resource
import sys
import time
from collections import defaultdict

import torch
from transformers import AutoModelForCausalLM

prompts_file, model_dir, max_new, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
results = sys.argv[5] if len(sys.argv) > 5 else "bench-results/rollout.jsonl"
torch.set_num_threads(2)
torch.manual_seed(7)

rows = json.load(open(prompts_file))
by_agent = defaultdict(list)
for row in rows:
    by_agent[row["agent"]].append(row["prompt_tokens"])

model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
eos = model.generation_config.eos_token_id
eos = set(eos if isinstance(eos, list) else [eos])
pad = model.generation_config.pad_token_id
pad = pad if pad is not None else min(eos)

generated, seconds = 0, 0.0
with torch.inference_mode():
    for agent, prompts in by_agent.items():
        longest = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
        started = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=max_new, pad_token_id=pad)
        seconds += time.perf_counter() - started
        for row in out[:, longest:].tolist():
            n = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            generated += n

line = {
    "label": label, "side": "transformers", "prompts": prompts_file.rsplit("/", 1)[-1], "rows": len(rows),
    "generated_tokens": generated, "model_seconds": round(seconds, 2),
    "tokens_per_second": round(generated / seconds, 1),
    "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
}
print(json.dumps(line))
with open(results, "a") as f:
    f.write(json.dumps(line) + "\n")
