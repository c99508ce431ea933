"""Loads the checkpoints petting wrote (tests/it/model.rs `export_for_transformers`) with
Hugging Face transformers and PEFT, unchanged, and compares their per-token logprobs with
the ones petting computed. Needs torch, transformers and peft (the reference env of
../shared/bench/anchors/setup-pyref.sh plus `pip install peft`); too large for CI.

Usage: PETTING_EXPORT_DIR=/tmp/x cargo test --test it export_for_transformers -- --ignored
       $PY scripts/experiments/check-transformers-load.py /tmp/x
"""
import json, sys
import torch
from transformers import AutoModelForCausalLM

out = sys.argv[1]
worst = 0.0
checked = 0
models = {}
for line in open(f"{out}/expected.jsonl"):
    case = json.loads(line)
    key = (case["dir"], case["adapter"])
    if key not in models:
        model = AutoModelForCausalLM.from_pretrained(case["dir"], dtype=torch.float32)
        if case["adapter"]:
            from peft import PeftModel
            model = PeftModel.from_pretrained(model, case["adapter"])
        models[key] = model.eval()
    model = models[key]
    p, r = case["prompt_ids"], case["response_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([p + r])).logits[0].float()
    logp = torch.log_softmax(logits, -1)[len(p) - 1:-1].gather(1, torch.tensor(r)[:, None])[:, 0]
    err = (logp - torch.tensor(case["logprobs"])).abs().max().item()
    worst = max(worst, err)
    checked += 1
    print(f"{case['dir'].split('/')[-1]:>20} adapter={bool(case['adapter'])!s:5} max |logprob diff| = {err:.2e}")
print(f"{checked} cases, worst max abs logprob difference {worst:.2e}")
sys.exit(0 if worst <= 1e-4 else 1)
