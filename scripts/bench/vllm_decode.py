"""vLLM's side of the synthetic decode in BENCHMARKS.md ("Sampling engines"): 64 random
prompts of 300 tokens, 64 greedy new tokens each (EOS ignored), sent at once, three
rounds. The first round prefills and decodes; the later ones find every prompt in the
server's prefix cache, so they time decode. petting's side:
`cargo bench --profile dev --bench model -- --model-dir models/smollm2-135m-instruct
--workload decode --batch 64 --prompt-len 300 --new-tokens 64`.

Usage: .vllm/bin/python scripts/bench/vllm_decode.py http://127.0.0.1:8411
"""

import concurrent.futures
import json
import random
import sys
import time
import urllib.request

ROWS, PROMPT, NEW = 64, 300, 64


def complete(url, prompt):
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": NEW, "temperature": 0.0, "ignore_eos": True}
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request) as response:
        return json.load(response)["usage"]["completion_tokens"]


def main():
    url = sys.argv[1].rstrip("/")
    rng = random.Random(1234)
    prompts = [[rng.randrange(100, 49000) for _ in range(PROMPT)] for _ in range(ROWS)]
    for round in range(3):
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(ROWS) as pool:
            tokens = sum(pool.map(lambda p: complete(url, p), prompts))
        seconds = time.perf_counter() - started
        print(json.dumps({"round": round, "tokens": tokens, "seconds": round_to(seconds), "tokens_per_s": round_to(tokens / seconds)}))


def round_to(x):
    return float(f"{x:.2f}")


if __name__ == "__main__":
    main()
