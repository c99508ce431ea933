"""Hugging Face `generate` on the GPU workload of `benches/model.rs --workload decode`.

A model of CONFIG's shape with random weights (seed 0), bf16 on CUDA, sdpa attention;
BATCH prompts of PROMPT random ids, greedy, exactly NEW new tokens (EOS cannot stop a
row early). Timed: one forward over the prompts keeping the last logits (prefill), and
the whole `generate`; decode = generate - prefill. 1 warm-up and REPS timed reps,
medians. Prints one JSON line.

Usage: python scripts/bench/decode_hf.py CONFIG [BATCH PROMPT NEW REPS]
"""

import json
import statistics
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

config_file = sys.argv[1]
batch, prompt, new, reps = (int(x) for x in (sys.argv[2:6] + ["64", "256", "128", "5"][len(sys.argv[2:6]):]))
config = AutoConfig.from_pretrained(config_file)
torch.manual_seed(0)
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
ids = torch.randint(3, config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(1234)).cuda()
mask = torch.ones_like(ids)


def timed(f):
    torch.cuda.synchronize()
    start = time.perf_counter()
    f()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def prefill():
    model(input_ids=ids, attention_mask=mask, logits_to_keep=1)


def generate():
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
                         min_new_tokens=new, pad_token_id=0)
    assert out.shape == (batch, prompt + new)


with torch.inference_mode():
    torch.cuda.reset_peak_memory_stats()
    results = {}
    for name, f in [("prefill", prefill), ("generate", generate)]:
        f()
        results[name] = statistics.median(timed(f) for _ in range(reps))
decode = results["generate"] - results["prefill"]
print(json.dumps({
    "side": "transformers", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
    "config": config_file, "batch": batch, "prompt": prompt, "new_tokens": new, "reps": reps,
    "prefill_s": round(results["prefill"], 4), "generate_s": round(results["generate"], 3),
    "decode_tokens_per_s": round(batch * new / decode, 1),
    "generate_tokens_per_s": round(batch * new / results["generate"], 1),
    "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
}))
