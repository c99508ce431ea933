#!/usr/bin/env python3
"""Prints RESULTS.md's headline table from the committed results/*/compare.csv files.

    python3 results/table.py                      # the headline table (markdown)
    python3 results/table.py --paper              # the grid columns beside the paper's Qwen3-1.7B
    python3 results/table.py results/plan-path results/plan-path-v10   # those CSVs side by side

A headline column names, per group of seeds, the compare.csv files that hold its rows;
a row takes, in each group, the first file that has the row's method. No seed of the
column may be covered twice; a row that covers only some says which, "(seed 1)". A file
over one seed gives that seed's success; a file over two seeds gives both, as mean -/+
std/sqrt(2) (petting compare's std is the sample std, ddof 1, so for two seeds this is
exact); a file over all the column's seeds is used as it is. The cell is the mean and
sample std over the seeds, in percent. Standard library only.
"""

import csv
import math
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

HERE = Path(__file__).resolve().parent

# headline row -> the method name petting compare writes
ROWS = [
    ("single agent", "single agent"),
    ("single agent + GRPO ¹", "single agent + AT-GRPO"),
    ("MAS (untrained)", "MAS"),
    ("MAS + GRPO (shared)", "MAS + GRPO (shared)"),
    ("MAS + PPO, a critic per agent", "MAS + PPO (GAE) (shared)"),
    ("MAS + MAPPO, centralised critics", "MAS + MAPPO (shared)"),
    ("MAS + AT-GRPO (shared)", "MAS + AT-GRPO (shared)"),
    ("MAS + AT-GRPO (per-role, L2)", "MAS + AT-GRPO (per-role)"),
    ("per-role L2, swapped", "MAS + AT-GRPO (per-role), swapped"),
    ("MAS + AT-GRPO (per-role LoRA, L1)", "MAS + AT-GRPO (per-role LoRA)"),
    ("per-role LoRA L1, swapped", "MAS + AT-GRPO (per-role LoRA), swapped"),
]

# (header, seeds, [(seeds of a group, [folders under results/])], marker for every cell,
#  {folder: note added to the cells it gives}, rows that do not apply: "n/a").
# A row no file has, and that applies, is "—" (not run).
COLUMNS = [
    ("Plan-Path 10×10 · embedded 0.77M · v30 · seeds 1–3", (1, 2, 3),
     [((1, 2, 3), ["plan-path-critic", "plan-path"])], "", {"plan-path": "†"}, ()),
    ("Sokoban 6×6 · embedded 0.77M · v30 · seeds 1–3", (1, 2, 3),
     [((1, 2, 3), ["sokoban-critic", "sokoban"])], "", {"sokoban": "†"}, ()),
    ("Sudoku 4×4 · embedded 0.77M · v30 · seeds 1–3", (1, 2, 3),
     [((1, 2, 3), ["sudoku"])], "†", {}, ()),
    ("math · SmolLM2-135M · v10 · seeds 1–3", (1, 2, 3),
     [((1,), ["math", "math-grpo", "math-per-role", "math-ppo"]),
      ((2, 3), ["math-s23", "math-grpo-s23"]),
      ((2,), ["math-per-role-s2"]),
      ((3,), ["math-per-role-s3"]),
      ((1, 2, 3), ["math-lora-s123"])], "", {}, ()),
    ("math · Qwen2.5-Coder-0.5B, bf16 on a GPU · v5 · seed 1", (1,),
     [((1,), ["math-h200-qwen"])], "", {}, ()),
    ("code (HumanEval) · Qwen2.5-Coder-0.5B · v10 · seed 1", (1,),
     [((1,), ["code", "code-grpo-s1", "code-per-role-s1-v5", "code-lora-s1"])], "",
     {"code-grpo-s1": "‡", "code-per-role-s1-v5": "(v5) ‡", "code-lora-s1": "‡"}, ()),
    ("tic-tac-toe vs minimax (wins of 100) · SmolLM2-135M · v10 · seeds 1–3", (1, 2, 3),
     [((1, 2, 3), ["tic-tac-toe-smollm2"])], "", {},
     ("single agent", "single agent + AT-GRPO", "MAS + AT-GRPO (per-role)",
      "MAS + AT-GRPO (per-role), swapped")),
]


# The paper's Qwen3-1.7B figures (PettingLLMs, Table 1: accuracy %), by our row label: its
# grid columns, then the math and code benchmarks nearest ours (harder than our arithmetic
# and HumanEval).
PAPER_COLUMNS = ["Plan-Path", "Sokoban", "Sudoku", "OlympiadBench", "APPS"]
PAPER = {
    "single agent": [5.0, 0.0, 7.0, 22.2, 16.2],
    "single agent + GRPO ¹": [11.0, 3.0, 29.0, 23.8, 17.0],
    "MAS (untrained)": [10.0, 0.0, 69.0, 35.9, 16.6],
    "MAS + AT-GRPO (shared)": [96.0, 10.0, 99.0, 39.6, 17.6],
    "MAS + AT-GRPO (per-role, L2)": [97.0, 11.5, 99.0, 35.2, 18.6],
}
# Our grid columns (their index in COLUMNS), each beside the paper's.
BESIDE = [(0, "Plan-Path"), (1, "Sokoban"), (2, "Sudoku")]


def read(folder):
    path = HERE / folder / "compare.csv"
    with open(path, newline="") as f:
        return {r["method"]: r for r in csv.DictReader(f)}


def seed_values(row, n):
    mean, std, seeds = float(row["success_mean"]), float(row["success_std"]), int(row["seeds"])
    if seeds != n:
        raise SystemExit(f"{row['method']}: {seeds} seeds where the group has {n}")
    if n == 1:
        return [mean]
    if n == 2:
        half = std / math.sqrt(2)
        return [mean - half, mean + half]
    return None  # used as it is


def pct(x):
    # half up, as the CSV's four decimals are already rounded (0.6835 -> 68.4)
    return str(Decimal(repr(round(100 * x, 9))).quantize(Decimal("0.1"), ROUND_HALF_UP))


def fmt(mean, std, n):
    return pct(mean) if n == 1 else f"{pct(mean)} ± {pct(std)}"


def cell(method, seeds, groups, marker, notes, na):
    if method in na:
        return "n/a"
    covered, values, whole, note = [], [], None, ""
    for group_seeds, folders in groups:
        for folder in folders:
            row = read(folder).get(method)
            if row is None:
                continue
            vals = seed_values(row, len(group_seeds))
            if vals is None:
                whole = (float(row["success_mean"]), float(row["success_std"]))
            else:
                values += vals
            covered += group_seeds
            note = notes.get(folder, note)
            break
    if not covered:
        return "—"
    if len(set(covered)) != len(covered) or not set(covered) <= set(seeds):
        raise SystemExit(f"{method}: seeds {sorted(covered)}, the column has {list(seeds)}")
    if len(covered) < len(seeds):  # a row not yet run on every seed says which it has
        note = " ".join(t for t in (note, f"(seed{'s' if len(covered) > 1 else ''} "
                                          f"{', '.join(map(str, sorted(covered)))})") if t)
        seeds = covered
    if whole is not None:
        if values:
            raise SystemExit(f"{method}: a whole-column file and per-seed files")
        mean, std = whole
    else:
        mean = sum(values) / len(values)
        std = (math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
               if len(values) > 1 else 0.0)
    text = fmt(mean, std, len(seeds))
    return " ".join(t for t in (text, note, marker) if t)


def headline():
    print("| method | " + " | ".join(c[0] for c in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for label, method in ROWS:
        cells = [cell(method, seeds, groups, marker, notes, na)
                 for _, seeds, groups, marker, notes, na in COLUMNS]
        print(f"| {label} | " + " | ".join(cells) + " |")


def beside_paper():
    """The rows the paper has: our grid cells beside its Qwen3-1.7B ones (a model 2,200
    times the embedded default), then its math and code columns, whose benchmarks we do
    not run."""
    others = PAPER_COLUMNS[len(BESIDE):]
    head = [f"{name} · ours | {name} · paper" for _, name in BESIDE] + [f"{c} · paper" for c in others]
    print("| method | " + " | ".join(head) + " |")
    print("|---" * (2 * len(BESIDE) + len(others) + 1) + "|")
    for label, method in ROWS:
        if label not in PAPER:
            continue
        paper = [f"{v:.1f}" for v in PAPER[label]]
        cells = []
        for i, name in BESIDE:
            _, seeds, groups, marker, notes, na = COLUMNS[i]
            cells += [cell(method, seeds, groups, marker, notes, na), paper[PAPER_COLUMNS.index(name)]]
        cells += paper[len(BESIDE):]
        print(f"| {label} | " + " | ".join(cells) + " |")


def side_by_side(folders):
    tables = [read(Path(f).name) for f in folders]
    methods = []
    for t in tables:
        methods += [m for m in t if m not in methods]
    print("| method | " + " | ".join(Path(f).name for f in folders) + " |")
    print("|---" * (len(folders) + 1) + "|")
    for m in methods:
        cells = []
        for t in tables:
            r = t.get(m)
            cells.append("—" if r is None else
                         fmt(float(r["success_mean"]), float(r["success_std"]), int(r["seeds"])))
        print(f"| {m} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if sys.argv[1:] == ["--paper"]:
        beside_paper()
    elif len(sys.argv) > 1:
        side_by_side(sys.argv[1:])
    else:
        headline()
