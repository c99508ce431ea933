"""One GRPO step of TRL's GRPOTrainer on a real model folder: the other side of
`cargo bench --bench model -- --workload grpo --model-dir DIR` (benches/model.rs).

Same work as petting's side: the first 4 problems of datasets/math/gsm_symbolic.jsonl
as conversational prompts (the folder's chat template), 4 completions each of exactly
64 sampled tokens (temperature 1, top-p 1, top-k 0), a reward counting completion ids
≡ 3 mod 64, AdamW lr 1e-5 without weight decay, no reference model (beta 0), float32 or
bf16, 2 threads, CPU. A step is timed from on_step_begin to on_step_end (generation,
reward, loss, backward, optimiser); the median over steps 2..N is reported, as in
../shared/bench/anchors/bench_grpo.py.

Usage: PY scripts/bench/grpo_trl.py MODEL_DIR [--steps 6] [--dtype f32|bf16] [--out FILE]
"""
import argparse, json, os, resource, statistics, sys, tempfile, time, warnings

ap = argparse.ArgumentParser()
ap.add_argument("model_dir")
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
ap.add_argument("--out", default=None)
a = ap.parse_args()

import torch
torch.set_num_threads(2)
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

warnings.filterwarnings("ignore")
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
problems = [json.loads(l)["problem"] for l in open(os.path.join(root, "datasets/math/gsm_symbolic.jsonl"))][:4]
# One prompt per optimiser step's worth of generations, repeated for every step.
rows = [{"prompt": [{"role": "user", "content": p}]} for p in problems] * (a.steps + 1)

tok = AutoTokenizer.from_pretrained(a.model_dir)
if tok.pad_token is None:
    tok.pad_token = tok.eos_token
dtype = torch.float32 if a.dtype == "f32" else torch.bfloat16
model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=dtype, attn_implementation="sdpa")


def reward(completion_ids, **kwargs):
    return [float(sum(1 for t in ids if t % 64 == 3)) for ids in completion_ids]


class Clock(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.steps.append(time.perf_counter() - self.t0)


config = GRPOConfig(
    output_dir=tempfile.mkdtemp(),
    num_generations=4,
    per_device_train_batch_size=16,
    gradient_accumulation_steps=1,
    max_completion_length=64,
    generation_kwargs={"min_new_tokens": 64},
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    beta=0.0,
    learning_rate=1e-5,
    weight_decay=0.0,
    use_cpu=True,
    bf16=a.dtype == "bf16",
    report_to="none",
    logging_steps=1,
    max_steps=a.steps,
    seed=0,
    dataloader_num_workers=0,
    save_strategy="no",
    shuffle_dataset=False,
)
clock = Clock()
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=Dataset.from_list(rows),
                      processing_class=tok, callbacks=[clock])
trainer.train()
timed = clock.steps[1:]
line = {
    "side": "trl-grpo",
    "model": a.model_dir,
    "workload": "grpo",
    "dtype": a.dtype,
    "reps_s": timed,
    "median_s": statistics.median(timed),
    "tokens_per_s": 16 * 64 / statistics.median(timed),
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "versions": {"torch": torch.__version__, "trl": __import__("trl").__version__,
                 "transformers": __import__("transformers").__version__},
}
print(json.dumps(line))
if a.out:
    with open(a.out, "a") as f:
        f.write(json.dumps(line) + "\n")
