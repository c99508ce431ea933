"""What "always play the prompt's example cell" scores in a tic-tac-toe run's evaluation.

    python3 scripts/tic_tac_toe_example_baseline.py runs/results/tic-tac-toe-smollm2-s1 [ITERATION]

The answer format's example cell is a function of the position
(`TicTacToe::example_cell` in src/envs/tic_tac_toe.rs), so a policy that copies it is a
fixed policy. This replays the run's test positions with that policy as X against the
minimax O, prints its wins, draws and mean `turns` (completed rounds of two moves, as the
evals table counts them), and for each policy evaluated at ITERATION (default: the last)
how many of its games ended exactly as the copier's (same reward and turns). A policy
whose games all match plays the example cell, whatever it learned in training.
PETTING selects the binary (default target/release/petting).
"""

import csv
import io
import json
import os
import subprocess
import sys

MASK = (1 << 64) - 1
LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
X, O = 0, 1


def mix(z):
    """splitmix64's output function, as src/rng.rs `mix`."""
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def stream(keys):
    """src/rng.rs `stream`."""
    acc = 0x5EED0F9E771265
    for key in keys:
        acc = mix(acc ^ mix(key))
    return acc


def example_cell(cells):
    position = 0
    for cell in cells:
        position = (position * 3 + (0 if cell is None else cell + 1)) & MASK
    return stream([position]) % 9


def winner(cells):
    for a, b, c in LINES:
        if cells[a] is not None and cells[a] == cells[b] == cells[c]:
            return cells[a]
    return None


def minimax(cells, to_move):
    """(value for the player to move, best cell: the lowest among equals), as src/envs/tic_tac_toe.rs."""
    if winner(cells) is not None:
        return -1, None
    best = (None, None)
    for cell in range(9):
        if cells[cell] is None:
            after = list(cells)
            after[cell] = to_move
            value = -minimax(after, 1 - to_move)[0]
            if best[0] is None or value > best[0]:
                best = (value, cell)
    return (0, None) if best[1] is None else best


def copier_game(cells):
    """(X's result, completed rounds) of the example copier as X against minimax as O."""
    to_move = X if cells.count(X) == cells.count(O) else O
    moves = 0
    while True:
        cell = example_cell(cells) if to_move == X else minimax(cells, O)[1]
        if cells[cell] is not None:  # a taken cell loses
            return 0.0, (moves + 1) // 2
        cells = list(cells)
        cells[cell] = to_move
        moves += 1
        if winner(cells) == to_move:
            return (1.0 if to_move == X else 0.0), moves // 2
        if None not in cells:
            return 0.5, moves // 2
        to_move = 1 - to_move


def sql(petting, store, query):
    out = subprocess.run([petting, "sql", store, query, "--format", "csv"], capture_output=True, text=True, check=True)
    return list(csv.DictReader(io.StringIO(out.stdout)))


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    store = sys.argv[1]
    petting = os.environ.get("PETTING", "target/release/petting")
    iteration = sys.argv[2] if len(sys.argv) == 3 else sql(petting, store, "SELECT max(iteration) AS i FROM evals")[0]["i"]
    copier = {}
    for task in sql(petting, store, "SELECT task_id, instance FROM tasks WHERE split = 'test'"):
        board = json.loads(task["instance"])["board"]
        cells = [None if mark == "." else (X if mark == "X" else O) for row in board for mark in row]
        copier[task["task_id"]] = copier_game(cells)
    results = list(copier.values())
    print(
        f"example copier: {sum(r == 1.0 for r, _ in results)} wins, {sum(r == 0.5 for r, _ in results)} draws, "
        f"{sum(t for _, t in results) / len(results):.2f} turns a game, over {len(results)} test positions"
    )
    games = sql(petting, store, f"SELECT policies, task_id, reward, turns FROM evals WHERE iteration = {int(iteration)}")
    by_policy = {}
    for game in games:
        same = copier[game["task_id"]] == (float(game["reward"]), int(game["turns"]))
        by_policy.setdefault(game["policies"], []).append(same)
    for policies, same in sorted(by_policy.items()):
        print(f"{policies} at iteration {iteration}: {sum(same)} of {len(same)} games as the copier's")


if __name__ == "__main__":
    main()
