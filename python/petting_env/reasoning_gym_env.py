"""reasoning-gym datasets as petting tasks (``env: {name: reasoning_gym, dataset: ..., config: {...}}``).

The ``env:`` mapping: ``dataset`` names a reasoning-gym dataset (``basic_arithmetic``)
and ``config`` holds its options, passed to ``reasoning_gym.create_dataset`` (all but
``seed`` and ``size``, which the ``tasks`` request sets).

Task rows are the dataset's entries (``question``, ``answer``, ``metadata``), made
JSON-safe. The rows of split S drawn with seed s come from
``create_dataset(name, seed=task_seed(s, S), size=count, **config)``: the same seed
gives the same rows, and train and test rows come from seeds far apart (reasoning-gym
seeds row i with ``seed + i``).

Scoring uses the dataset's own ``score_answer(answer, entry=task)``; a missing answer
scores 0. Scorers may rely on metadata that JSON changed (a tuple that came back as a
list), so a row this host generated is scored against its original entry.

As an environment it is one turn: the single agent ``agent`` sees the question, and
its reply is scored on the text after its last ``####`` (rewards and team reward both
the score; success when the score is 1).
"""

from __future__ import annotations

import json
from typing import Any

from .env import Env, StepResult, json_safe, task_seed

ANSWER_MARKER = "####"
ORIGINAL_ENTRIES_KEPT = 100_000


def extract_answer(reply: str) -> str | None:
    """The text after the last ``####`` marker, stripped; None without a marker."""
    if ANSWER_MARKER not in reply:
        return None
    return reply.rpartition(ANSWER_MARKER)[2].strip()


def dataset_config(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name = config.get("dataset")
    if not isinstance(name, str) or not name:
        raise ValueError("env.dataset must name a reasoning-gym dataset, e.g. 'basic_arithmetic'")
    options = config.get("config") or {}
    if not isinstance(options, dict):
        raise ValueError(f"env.config must be a mapping, got {options!r}")
    clash = sorted({"seed", "size"} & options.keys())
    if clash:
        raise ValueError(f"env.config must not set {', '.join(clash)}: the tasks request sets them")
    return name, options


class ReasoningGymEnv(Env):
    """One question of a reasoning-gym dataset; see the module's docstring."""

    agents = ("agent",)
    _scorers: dict[str, Any] = {}  # one dataset object per configuration, to call score_answer on
    _originals: dict[str, dict[str, Any]] = {}  # JSON row -> the entry it was made from

    @classmethod
    def validate(cls, config: dict[str, Any]) -> None:
        cls._scorer(config)

    @classmethod
    def tasks(cls, config: dict[str, Any], split: str, count: int, seed: int) -> list[dict[str, Any]]:
        import reasoning_gym

        name, options = dataset_config(config)
        base = task_seed(seed, split)
        if count == 0:
            return []
        dataset = reasoning_gym.create_dataset(name, seed=base, size=count, **options)
        rows = []
        for index in range(count):
            entry = dataset[index]
            row = json_safe(entry)
            if len(cls._originals) < ORIGINAL_ENTRIES_KEPT:
                cls._originals[cls._key(row)] = entry
            rows.append(row)
        return rows

    @classmethod
    def score(cls, config: dict[str, Any], task: dict[str, Any], reply: str, answer: str | None) -> float:
        if answer is None:
            return 0.0
        entry = cls._originals.get(cls._key(task), task)
        return float(cls._scorer(config).score_answer(answer, entry=entry))

    def reset(self, task: dict[str, Any], seed: int) -> None:
        if not isinstance(task.get("question"), str):
            raise ValueError("a reasoning-gym task must have a 'question' string")
        self.task = task
        self.done = False

    def observe(self) -> tuple[str, str] | None:
        return None if self.done else ("agent", self.task["question"])

    def step(self, reply: str) -> StepResult:
        score = self.score(self.config, self.task, reply, extract_answer(reply))
        self.done = True
        return StepResult(rewards={"agent": score}, team_reward=score, done=True, success=score >= 1.0)

    @classmethod
    def _scorer(cls, config: dict[str, Any]) -> Any:
        import reasoning_gym

        name, options = dataset_config(config)
        key = json.dumps([name, options], sort_keys=True, default=str)
        if key not in cls._scorers:
            cls._scorers[key] = reasoning_gym.create_dataset(name, seed=0, size=1, **options)
        return cls._scorers[key]

    @staticmethod
    def _key(row: dict[str, Any]) -> str:
        return json.dumps(json_safe(row), sort_keys=True)
