"""An example environment: two agents take turns guessing a secret number.

Use it from a run file as ``env: {name: external, module: guess_number:GuessNumber}``
(with this folder as the working directory), or let the script be the host:
``env: {name: external, command: [python, guess_number.py]}``.

alice and bob alternate; after each guess both see whether the secret is higher or
lower. Whoever names it gets a local reward of 1, and the team shares 1 when it is found
within ``max_turns`` guesses (success). A reply without a number is invalid: the mover
loses ``invalid_penalty`` and the turn passes.
"""

from __future__ import annotations

import random
import re
from typing import Any

from petting_env import Env, StepResult, serve, task_seed


class GuessNumber(Env):
    """Config: ``high`` (the secret is in 1..high, default 100), ``max_turns`` (default 10),
    ``invalid_penalty`` (default 0.1). Task rows: ``{"secret": n}``; without one the
    secret is drawn from ``random`` (which the host seeds per episode)."""

    agents = ("alice", "bob")

    def reset(self, task: dict[str, Any], seed: int) -> None:
        self.high = int(self.config.get("high", 100))
        self.max_turns = int(self.config.get("max_turns", 10))
        self.penalty = float(self.config.get("invalid_penalty", 0.1))
        self.secret = int(task["secret"]) if "secret" in task else random.randint(1, self.high)
        self.history: list[str] = []
        self.turns = 0
        self.done = False

    def mover(self) -> str:
        return self.agents[self.turns % 2]

    def observe(self) -> tuple[str, str] | None:
        if self.done:
            return None
        lines = [
            f"You are {self.mover()}. Together with your teammate, find the secret number between 1 and {self.high}.",
            f"Guesses left: {self.max_turns - self.turns}. Reply with one number.",
        ]
        lines += self.history
        return self.mover(), "\n".join(lines)

    def step(self, reply: str) -> StepResult:
        mover = self.mover()
        self.turns += 1
        match = re.search(r"-?\d+", reply)
        if match is None:
            self.history.append(f"{mover} said no number.")
            result = StepResult(rewards={mover: -self.penalty}, invalid=True, feedback="Reply with a number.")
        else:
            guess = int(match.group())
            if guess == self.secret:
                self.done = True
                self.history.append(f"{mover} guessed {guess}: correct!")
                return StepResult(rewards={mover: 1.0}, team_reward=1.0, done=True, success=True,
                                  feedback=f"{mover} found {guess}.")
            hint = "higher" if self.secret > guess else "lower"
            self.history.append(f"{mover} guessed {guess}: the secret is {hint}.")
            result = StepResult(rewards={mover: 0.0}, feedback=f"The secret is {hint} than {guess}.")
        if self.turns >= self.max_turns:
            self.done = True
            result.done = True
            result.feedback += f" Out of guesses; the secret was {self.secret}."
        return result

    @classmethod
    def tasks(cls, config: dict[str, Any], split: str, count: int, seed: int) -> list[dict[str, Any]]:
        # Distinct secrets, and none shared by the splits: every third number is a
        # test secret, the rest are training ones.
        rng = random.Random(task_seed(seed, split))
        high = int(config.get("high", 100))
        pool = [n for n in range(1, high + 1) if (n % 3 == 0) == (split == "test")]
        if count > len(pool):
            raise ValueError(f"{count} {split} tasks wanted, but high = {high} has only {len(pool)} {split} secrets")
        return [{"secret": secret} for secret in rng.sample(pool, count)]


if __name__ == "__main__":
    serve(GuessNumber)
