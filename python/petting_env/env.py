"""The environment contract: the base class a user's environment subclasses.

petting runs many episodes of one environment at once, each behind an id it chooses.
For every episode the host makes one instance of the environment class, calls
``reset(task, seed)`` once, then alternates ``observe()`` (whose turn is it, and what
does that agent see?) and ``step(reply)`` (the agent's full reply text) until a step
says ``done``. ``fork()`` must give an independent copy: petting branches an episode to
sample several continuations of the same position, and stepping one branch must never
move another.

The host gives each episode its own state of Python's ``random`` module: it is seeded
with the seed of ``make`` before ``reset`` and swapped in around every call into the
episode, and a fork copies it. An environment may therefore draw from ``random``
freely and still be reproducible and fork cleanly. (numpy's global generator is not
covered: keep a ``numpy.random.Generator`` on the instance instead.)
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

SPLITS = ("train", "test")


@dataclass
class StepResult:
    """What one step did.

    rewards: the local reward this step credits to each agent, by agent name (usually
        only the mover; at the end of a game, every player's final reward).
    team_reward: the reward the whole team shares for this step.
    done: the episode is over; ``observe()`` is not called again.
    success: whether the episode counts as a success (petting shows the rate); only
        meaningful on the final step.
    feedback: text about the step worth showing (why a move was invalid, who won).
    invalid: the reply was not a valid move; any penalty is already in ``rewards``. In
        a step where several agents acted at once, True (every reply) or the names of
        the agents whose replies were invalid.
    """

    rewards: dict[str, float] = field(default_factory=dict)
    team_reward: float = 0.0
    done: bool = False
    success: bool = False
    feedback: str = ""
    invalid: bool | list[str] = False


class Env:
    """Base class of an environment petting trains on.

    Subclass it, set ``agents`` (or define a classmethod ``agents(config)`` when the
    names depend on the configuration) and implement ``reset``, ``observe`` and
    ``step``. ``tasks`` and ``score`` are optional. ``config`` is the ``config:``
    mapping of the run file's ``env:`` section (for the built-in adapters, the whole
    ``env:`` mapping). Anything an environment prints goes to the host's stderr, never
    into the protocol.
    """

    agents: ClassVar[Sequence[str]] = ("agent",)

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    @classmethod
    def validate(cls, config: dict[str, Any]) -> None:
        """Called once when petting connects; raise to refuse a bad configuration early."""

    def reset(self, task: dict[str, Any], seed: int) -> None:
        """Start the episode for ``task`` (a row from ``tasks`` or petting's data files)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement reset()")

    def observe(self) -> tuple[str, str] | dict[str, str] | None:
        """Whose turn it is and the text that agent sees, or None once the episode is over.

        A mapping ``{agent: text, ...}`` asks several agents to act at once, each on
        what it alone sees (CoMLRL's decentralised agents); their replies come to
        ``step`` together. Called once after ``reset`` and once after every step that is
        not done; it should not change the episode.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement observe()")

    def step(self, reply: str | dict[str, str]) -> StepResult:
        """Apply the reply of the agent ``observe()`` named, and say what it did.

        After an ``observe()`` that named several agents, ``reply`` maps each of them to
        its reply, and the step judges them together.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement step()")

    def fork(self) -> Env:
        """An independent copy of this episode; override when deepcopy is wrong or slow."""
        return copy.deepcopy(self)

    @classmethod
    def tasks(cls, config: dict[str, Any], split: str, count: int, seed: int) -> list[dict[str, Any]]:
        """``count`` task rows for ``split`` ("train" or "test"), reproducible from ``seed``.

        Optional: without it, petting takes tasks from the run's data files.
        ``task_seed(seed, split)`` gives train and test separate seeds.
        """
        raise NotImplementedError(f"{cls.__name__} has no tasks()")

    @classmethod
    def score(cls, config: dict[str, Any], task: dict[str, Any], reply: str, answer: str | None) -> float:
        """Score a single-turn reply to ``task``; ``answer`` is the text after the last '####'.

        Optional: a ``reward`` function named in the run file takes precedence.
        """
        raise NotImplementedError(f"{cls.__name__} has no score()")


def agent_names(env_class: type, config: dict[str, Any]) -> list[str]:
    """The agents of ``env_class``: its ``agents`` list, or what its ``agents(config)`` returns."""
    agents = getattr(env_class, "agents", ("agent",))
    if callable(agents):
        agents = agents(config)
    if isinstance(agents, str) or not all(isinstance(name, str) for name in agents):
        raise TypeError(f"{env_class.__name__}.agents must be a list of names, got {agents!r}")
    names = list(agents)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"{env_class.__name__}.agents must be distinct names, at least one: {names!r}")
    return names


def task_seed(seed: int, split: str) -> int:
    """The seed of the ``split`` rows drawn with ``seed``: a hash of both, below 2**31.

    Generators that seed row i with ``base + i`` (reasoning-gym does) would make
    seeds like ``2*seed`` and ``2*seed + 1`` share all rows but one; hashing puts train
    and test (and different seeds) far apart, and staying below 2**31 keeps
    ``base + i`` a valid numpy seed.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    digest = hashlib.sha256(f"petting-tasks:{split}:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def not_json(value: Any, path: str = "") -> tuple[str, Any] | None:
    """Where ``value`` holds something that ``json_safe`` could only write as its
    string (a Fraction, a Decimal, an object, a non-finite float), and that thing; None
    when it is all JSON. A task row is what the task is: it must not silently become
    another value's repr."""
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if value == value and value not in (float("inf"), float("-inf")) else (path, value)
    if isinstance(value, dict):
        for key, item in value.items():
            found = not_json(item, f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            found = not_json(item, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    if hasattr(value, "tolist"):
        return not_json(value.tolist(), path)
    if hasattr(value, "__dataclass_fields__"):
        return not_json({name: getattr(value, name) for name in value.__dataclass_fields__}, path)
    return (path, value)


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data: tuples and sets become lists, other objects strings.

    Task rows travel to petting and back as JSON, so what a generator puts in them
    (tuples, sets, numpy numbers, fractions) must become something JSON can say.
    Non-finite floats become strings, since JSON has no NaN.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, (set, frozenset)):
        items = [json_safe(item) for item in value]
        return sorted(items, key=repr)
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return json_safe(value.tolist())
    if hasattr(value, "__dataclass_fields__"):
        return {name: json_safe(getattr(value, name)) for name in value.__dataclass_fields__}
    return str(value)
