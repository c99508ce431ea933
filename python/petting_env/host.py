"""The environment host: petting's Python end of the environment protocol (version 2).

petting starts ``python -m petting_env.host`` (or a user's script that calls
``petting_env.serve(MyEnv)``) and keeps it for the whole run. Both sides speak JSON,
one object per line: petting writes requests to the host's stdin, and the host
answers each, in order, with one line on stdout, ``{"ok": true, ...}`` or
``{"ok": false, "error": "..."}``. Batch requests (make, step, fork, score) answer per
item, so one broken episode does not fail the others: an item that fails has
``{"error": "..."}`` in its slot.

Protocol 2 adds steps in which several agents act at once: a Turn may be
``{"acting": [{"agent", "observation"}, ...], "done": false}`` and the step item then
carries ``replies`` (agent -> reply) instead of ``reply``. petting's hello offers both
versions (``protocol: 1, protocols: [1, 2]``) and speaks the one the host answers, so a
host written for protocol 1 still serves.

Requests: ``hello`` (which environment; answered with its agents), ``tasks`` (task rows
for a split), ``make`` (start episodes), ``step`` (apply replies), ``fork`` (copy
episodes), ``drop`` (forget episodes) and ``score`` (reward single-turn replies).
The module's ``Host`` methods say what each takes and answers.

stdout carries nothing but protocol lines: the host keeps the real stdin and stdout for
itself, points file descriptor 1 and ``sys.stdout`` at stderr and stdin at /dev/null,
so neither a stray ``print`` nor a child process in user code can corrupt the stream or
eat a request.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from .env import Env, StepResult, agent_names, json_safe, not_json, task_seed
from .loading import UserCodeError, describe_exception, load_env_class, load_reward

PROTOCOLS = (1, 2)
BUILTIN_ENVS = {"textarena", "reasoning_gym", "rewards"}


class RequestError(Exception):
    """The request as a whole cannot be answered; its message is the response's error."""


class ItemError(Exception):
    """One item of a batch failed; its message goes in that item's slot."""


@dataclass
class Episode:
    """One running episode: the environment, its own ``random`` state, whether it is over."""

    env: Any
    random_state: Any
    done: bool = False
    acting: list[str] = field(default_factory=list)
    joint: bool = False


def builtin_env_class(name: str) -> type:
    """The adapter class of a built-in environment, imported only when named."""
    if name == "rewards":
        # Only scores replies with hello's reward function: the tasks are petting's own
        # (a math or code dataset), and so are the episodes.
        return Env
    if name == "textarena":
        from .textarena_env import TextArenaEnv

        return TextArenaEnv
    from .reasoning_gym_env import ReasoningGymEnv

    return ReasoningGymEnv


def need(mapping: dict[str, Any], key: str, kind: type, what: str, error: type[Exception]) -> Any:
    """``mapping[key]`` if it is of ``kind`` (a boolean is not an integer here), else ``error``."""
    value = mapping.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise error(f"{what} needs '{key}' ({describe_kind(kind)}), got {value!r}")
    return value


def describe_kind(kind: type) -> str:
    names = {str: "a string", int: "an integer", dict: "an object", list: "a list"}
    return names.get(kind, kind.__name__)


def overridden(env_class: type, name: str) -> bool:
    """Whether ``env_class`` has its own classmethod ``name``, not Env's placeholder that raises."""
    method = getattr(env_class, name, None)
    if method is None:
        return False
    return getattr(method, "__func__", method) is not getattr(getattr(Env, name), "__func__")


def number(value: Any, what: str) -> float:
    """``value`` as a finite float (bools count as 0 and 1), else ItemError."""
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ItemError(f"{what} must be a finite number, got {value!r}")
    return float(value)


class Host:
    """The state behind the protocol: the environment class, its config and the episodes.

    ``env_class`` is given when a user's script serves its own class
    (``petting_env.serve``); otherwise ``hello`` names it.
    """

    def __init__(self, env_class: type | None = None) -> None:
        self.served_class = env_class
        self.env_class: type | None = None
        self.config: dict[str, Any] = {}
        self.agents: list[str] = []
        self.reward: Callable[[dict[str, Any], str], Any] | None = None
        self.protocol = max(PROTOCOLS)  # until hello picks one
        self.user_paths: list[Path] = []
        self.episodes: dict[str, Episode] = {}
        self.ops: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "hello": self.hello,
            "tasks": self.tasks,
            "make": self.make,
            "step": self.step,
            "fork": self.fork,
            "drop": self.drop,
            "score": self.score,
        }

    # ---- one line in, one line out

    def answer_line(self, line: bytes) -> dict[str, Any]:
        """The response to one request line; never raises."""
        try:
            request = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            return {"ok": False, "error": f"malformed request line (not JSON): {error}"}
        if not isinstance(request, dict):
            return {"ok": False, "error": f"malformed request: expected a JSON object, got {type(request).__name__}"}
        op = request.get("op")
        handler = self.ops.get(op) if isinstance(op, str) else None
        if handler is None:
            return {"ok": False, "error": f"unknown op {op!r}; the host answers {', '.join(self.ops)}"}
        if op != "hello" and self.env_class is None:
            return {"ok": False, "error": f"{op} before hello: the first request must be hello"}
        try:
            return {"ok": True, **handler(request)}
        except RequestError as error:
            return {"ok": False, "error": str(error)}
        except Exception as error:  # a bug in the host itself: keep serving, say what broke
            traceback.print_exc(file=sys.stderr)
            return {"ok": False, "error": f"{op} failed in the host: {describe_exception(error)}"}

    def each(self, request: dict[str, Any], key: str, answer: Callable[[dict[str, Any]], Any]) -> list[Any]:
        """Answer every item of ``request[key]``; a failed item becomes ``{"error": ...}``."""
        items = need(request, key, list, request["op"], RequestError)
        answers = []
        for index, item in enumerate(items):
            try:
                if not isinstance(item, dict):
                    raise ItemError(f"item {index} is not an object: {item!r}")
                answers.append(answer(item))
            except (ItemError, UserCodeError) as error:
                answers.append({"error": str(error)})
            except (Exception, SystemExit) as error:  # user code's sys.exit() must not end the host
                answers.append({"error": describe_exception(error, *self.user_paths)})
        return answers

    # ---- the ops

    def hello(self, request: dict[str, Any]) -> dict[str, Any]:
        """``{protocol, protocols?, env, workdir, reward?}`` -> ``{protocol, agents, turn_order}``.

        ``protocols`` lists the versions petting speaks; the answer's ``protocol`` is the
        one this host picks (2 where offered).

        ``env`` is the run file's ``env:`` mapping; ``name`` picks textarena,
        reasoning_gym or external (``module: my_env:MyEnv``, found from ``workdir``,
        which goes on ``sys.path`` and becomes the current directory). ``reward``
        (``rewards.py:fn``) names a function for ``score``.
        """
        if self.env_class is not None:
            raise RequestError("hello was already answered; one host serves one environment")
        offered = request.get("protocols", [request.get("protocol")])
        spoken = [v for v in offered if v in PROTOCOLS and not isinstance(v, bool)] if isinstance(offered, list) else []
        if not spoken:
            raise RequestError(f"protocol {offered!r} is not spoken here: this host speaks protocols {PROTOCOLS}")
        env = need(request, "env", dict, "hello", RequestError)
        given = request.get("workdir")
        workdir = Path.cwd() if given is None else Path(given) if isinstance(given, str) else None
        if workdir is None or not workdir.is_absolute() or not workdir.is_dir():
            raise RequestError(f"hello's workdir must be an absolute directory, got {given!r}")
        if str(workdir) not in sys.path:
            sys.path.insert(0, str(workdir))
        os.chdir(workdir)
        user_paths = [workdir]

        name = env.get("name")
        try:
            if self.served_class is not None:
                env_class, config = self.served_class, env.get("config") or {}
            elif name in BUILTIN_ENVS:
                env_class, config = builtin_env_class(name), env
            elif name == "external":
                if "module" not in env:
                    raise RequestError("env 'external' needs 'module' (my_env:MyEnv) or a command that serves it")
                env_class, config = load_env_class(env["module"], workdir), env.get("config") or {}
            else:
                known = ", ".join(sorted(BUILTIN_ENVS | {"external"}))
                raise RequestError(f"unknown env name {name!r}; known: {known}")
            if not isinstance(config, dict):
                raise RequestError(f"env config must be a mapping, got {config!r}")
            source = getattr(sys.modules.get(env_class.__module__), "__file__", None)
            if source and env_class.__module__.split(".")[0] != "petting_env":
                user_paths.append(Path(source).resolve().parent)
            agents = agent_names(env_class, config)
            validate = getattr(env_class, "validate", None)
            if callable(validate):
                validate(config)
            reward = load_reward(request["reward"], workdir) if request.get("reward") is not None else None
        except RequestError:
            raise
        except UserCodeError as error:
            raise RequestError(str(error)) from error
        except Exception as error:
            raise RequestError(f"env {name!r} refused its configuration: {describe_exception(error, *user_paths)}") from error

        self.env_class, self.config, self.agents, self.reward = env_class, config, agents, reward
        self.user_paths = user_paths
        self.protocol = max(spoken)
        return {"protocol": self.protocol, "agents": agents, "turn_order": "env"}

    def tasks(self, request: dict[str, Any]) -> dict[str, Any]:
        """``{split, count, seed}`` -> ``{tasks: [row, ...]}`` from the class's ``tasks()``."""
        assert self.env_class is not None
        split = need(request, "split", str, "tasks", RequestError)
        count = need(request, "count", int, "tasks", RequestError)
        seed = need(request, "seed", int, "tasks", RequestError)
        if split not in ("train", "test") or count < 0:
            raise RequestError(f"tasks needs split train or test and a count of 0 or more, got {split!r}, {count}")
        tasks = getattr(self.env_class, "tasks", None)
        if tasks is None or not overridden(self.env_class, "tasks"):
            raise RequestError(f"{self.env_class.__name__} has no tasks(): give the run data files instead")
        random.seed(task_seed(seed, split))
        try:
            rows = tasks(self.config, split, count, seed)
        except Exception as error:
            raise RequestError(f"tasks failed: {describe_exception(error, *self.user_paths)}") from error
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise RequestError(f"{self.env_class.__name__}.tasks() must return a list of dicts")
        for index, row in enumerate(rows):
            odd = not_json(row)
            if odd is not None:
                path, value = odd
                raise RequestError(
                    f"{self.env_class.__name__}.tasks() row {index}{path} is {value!r} ({type(value).__name__}), "
                    "which JSON cannot say: give task rows of str, int, float, bool, None, lists and dicts "
                    "(tuples, sets, numpy values and dataclasses are converted)"
                )
        return {"tasks": [json_safe(row) for row in rows]}

    def make(self, request: dict[str, Any]) -> dict[str, Any]:
        """``{items: [{id, task, seed}]}`` -> ``{items: [Turn | error]}``: start each episode.

        The episode's ``random`` state is seeded with ``seed`` before the class is made.
        """
        env_class = self.env_class
        assert env_class is not None

        def make_one(item: dict[str, Any]) -> dict[str, Any]:
            episode_id = need(item, "id", str, "make item", ItemError)
            if episode_id in self.episodes:
                raise ItemError(f"episode {episode_id!r} already exists")
            task = item.get("task", {})
            seed = item.get("seed", 0)
            if not isinstance(task, dict):
                raise ItemError(f"make item {episode_id!r}: task must be an object, got {task!r}")
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise ItemError(f"make item {episode_id!r}: seed must be an integer, got {seed!r}")
            random.seed(seed)
            env = env_class(self.config)
            env.reset(task, seed)
            episode = Episode(env, random.getstate())
            turn = self.turn(episode)
            self.episodes[episode_id] = episode
            return turn

        return {"items": self.each(request, "items", make_one)}

    def step(self, request: dict[str, Any]) -> dict[str, Any]:
        """``{items: [{id, reply} | {id, replies}]}`` -> ``{items: [Step | error]}``: apply each reply.

        Step: ``{rewards, team_reward, done, success, feedback, invalid, next}``, where
        ``next`` is the following Turn, or null once the episode is done. A step of
        several agents at once takes ``replies`` (each acting agent's) and may answer
        ``invalid`` as the list of agents whose replies were invalid.
        """

        def step_one(item: dict[str, Any]) -> dict[str, Any]:
            episode_id = need(item, "id", str, "step item", ItemError)
            episode = self.running(episode_id)
            reply = self.replies(item, episode, episode_id)
            with own_random(episode):
                result = episode.env.step(reply)
            answer = self.step_answer(result, episode.acting)
            if answer["done"]:
                episode.done = True
                answer["next"] = None
            else:
                answer["next"] = self.turn(episode)
                if answer["next"]["done"]:
                    raise ItemError(f"{self.class_name()}.step() said not done, but observe() then returned None")
            return answer

        return {"items": self.each(request, "items", step_one)}

    def fork(self, request: dict[str, Any]) -> dict[str, Any]:
        """``{items: [{id, new}]}`` -> ``{items: [{} | error]}``: ``new`` becomes an independent copy of ``id``."""

        def fork_one(item: dict[str, Any]) -> dict[str, Any]:
            episode_id = need(item, "id", str, "fork item", ItemError)
            new_id = need(item, "new", str, f"fork item {episode_id!r}", ItemError)
            episode = self.known(episode_id)
            if new_id in self.episodes:
                raise ItemError(f"episode {new_id!r} already exists")
            with own_random(episode):
                copy = episode.env.fork()
            if copy is episode.env:
                raise ItemError(f"{self.class_name()}.fork() returned the same object, not a copy")
            self.episodes[new_id] = Episode(copy, episode.random_state, episode.done, episode.acting, episode.joint)
            return {}

        return {"items": self.each(request, "items", fork_one)}

    def drop(self, request: dict[str, Any]) -> dict[str, Any]:
        """``{ids: [...]}`` -> ``{}``: forget those episodes; ids not known are ignored."""
        ids = need(request, "ids", list, "drop", RequestError)
        for episode_id in ids:
            if isinstance(episode_id, str):
                self.episodes.pop(episode_id, None)
        return {}

    def score(self, request: dict[str, Any]) -> dict[str, Any]:
        """``{items: [{task, reply, answer}]}`` -> ``{scores: [float | error]}``.

        The hello's reward function, ``fn(task, reply)``, when there is one; else the
        class's ``score(config, task, reply, answer)`` (reasoning_gym has one).
        """
        assert self.env_class is not None
        class_score = getattr(self.env_class, "score", None)
        if self.reward is None and (class_score is None or not overridden(self.env_class, "score")):
            raise RequestError(f"score needs a reward function: hello named none and {self.class_name()} has no score()")

        def score_one(item: dict[str, Any]) -> float:
            task = need(item, "task", dict, "score item", ItemError)
            reply = need(item, "reply", str, "score item", ItemError)
            answer = item.get("answer")
            if answer is not None and not isinstance(answer, str):
                raise ItemError(f"score item: answer must be a string or null, got {answer!r}")
            if self.reward is not None:
                value = self.reward(task, reply)
            else:
                assert class_score is not None
                value = class_score(self.config, task, reply, answer)
            if isinstance(value, bool):
                return float(value)
            return number(value, "the reward function's result" if self.reward else "score()")

        return {"scores": self.each(request, "items", score_one)}

    # ---- helpers

    def class_name(self) -> str:
        return self.env_class.__name__ if self.env_class is not None else "env"

    def known(self, episode_id: str) -> Episode:
        episode = self.episodes.get(episode_id)
        if episode is None:
            raise ItemError(f"unknown episode id {episode_id!r}")
        return episode

    def running(self, episode_id: str) -> Episode:
        episode = self.known(episode_id)
        if episode.done:
            raise ItemError(f"episode {episode_id!r} is finished")
        return episode

    def turn(self, episode: Episode) -> dict[str, Any]:
        """The Turn ``observe()`` gives: ``{agent, observation, done: false}``, with several
        agents at once ``{acting: [{agent, observation}, ...], done: false}``, or ``{done: true}``."""
        with own_random(episode):
            observed = episode.env.observe()
        if observed is None:
            episode.done = True
            return {"done": True}
        where = f"{self.class_name()}.observe()"
        joint = isinstance(observed, dict)
        if joint and self.protocol < 2:
            raise ItemError(f"{where} asked several agents at once, which protocol {self.protocol} cannot say")
        if not joint and not (isinstance(observed, tuple) and len(observed) == 2):
            raise ItemError(f"{where} must return (agent, text), {{agent: text, ...}} or None, got {observed!r}")
        acting = list(observed.items()) if joint else [observed]
        if not acting:
            raise ItemError(f"{where} returned an empty mapping: name the agents to act, or return None")
        for agent, text in acting:
            if agent not in self.agents:
                raise ItemError(f"{where} named agent {agent!r}, not one of {self.agents}")
            if not isinstance(text, str):
                raise ItemError(f"{where} must give text, got {type(text).__name__}")
        episode.acting, episode.joint = [agent for agent, _ in acting], joint
        if not joint:
            return {"agent": acting[0][0], "observation": acting[0][1], "done": False}
        return {"acting": [{"agent": agent, "observation": text} for agent, text in acting], "done": False}

    def replies(self, item: dict[str, Any], episode: Episode, episode_id: str) -> str | dict[str, str]:
        """The step item's reply, or in a step of several agents their replies, each asked agent's."""
        where = f"step item {episode_id!r}"
        if not episode.joint:
            return need(item, "reply", str, where, ItemError)
        replies = need(item, "replies", dict, where, ItemError)
        if sorted(replies) != sorted(episode.acting) or not all(isinstance(r, str) for r in replies.values()):
            raise ItemError(f"{where} must give a reply (text) of each agent asked, {episode.acting}; got {replies!r}")
        return replies

    def step_answer(self, result: Any, acting: list[str]) -> dict[str, Any]:
        """The Step fields of what ``step()`` returned (a StepResult or a dict of its fields)."""
        where = f"{self.class_name()}.step()"
        if isinstance(result, StepResult):
            result = {field.name: getattr(result, field.name) for field in fields(StepResult)}
        if not isinstance(result, dict):
            raise ItemError(f"{where} must return a StepResult, got {type(result).__name__}")
        unknown = set(result) - {field.name for field in fields(StepResult)}
        if unknown:
            raise ItemError(f"{where} returned unknown fields {sorted(unknown)}")
        rewards = result.get("rewards") or {}
        if not isinstance(rewards, dict):
            raise ItemError(f"{where} rewards must map agent names to numbers, got {rewards!r}")
        for agent in rewards:
            if agent not in self.agents:
                raise ItemError(f"{where} rewarded {agent!r}, not one of {self.agents}")
        feedback = result.get("feedback") or ""
        if not isinstance(feedback, str):
            raise ItemError(f"{where} feedback must be text, got {type(feedback).__name__}")
        invalid = result.get("invalid", False)
        if isinstance(invalid, list):
            unasked = [agent for agent in invalid if agent not in acting]
            if unasked:
                raise ItemError(f"{where} marked the replies of {unasked} invalid, but asked only {acting} this step")
        else:
            invalid = bool(invalid)
        return {
            "rewards": {agent: number(value, f"{where} reward of {agent}") for agent, value in rewards.items()},
            "team_reward": number(result.get("team_reward", 0.0), f"{where} team_reward"),
            "done": bool(result.get("done", False)),
            "success": bool(result.get("success", False)),
            "feedback": feedback,
            "invalid": invalid,
        }


@contextmanager
def own_random(episode: Episode) -> Iterator[None]:
    """Run with the episode's own ``random`` state, and keep what the call left of it."""
    random.setstate(episode.random_state)
    try:
        yield
    finally:
        episode.random_state = random.getstate()


def take_stdio() -> tuple[BinaryIO, BinaryIO]:
    """Keep the real stdin and stdout for the protocol; send user code's to /dev/null and stderr."""
    sys.stdout.flush()
    requests = os.fdopen(os.dup(0), "rb")
    responses = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull, encoding="utf-8")
    sys.stdout = sys.stderr
    return requests, responses


def encode(response: dict[str, Any]) -> bytes:
    """One response line; a response JSON cannot say becomes an error response instead."""
    try:
        text = json.dumps(response, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        text = json.dumps({"ok": False, "error": f"the response could not be written as JSON: {error}"})
    return text.encode("utf-8") + b"\n"


def run(env_class: type | None = None) -> int:
    """Answer requests on stdin until it closes; 0 then (1 if petting stopped reading)."""
    requests, responses = take_stdio()
    host = Host(env_class)
    while True:
        line = requests.readline()
        if not line:
            return 0
        response = host.answer_line(line.rstrip(b"\r\n"))
        try:
            responses.write(encode(response))
            responses.flush()
        except BrokenPipeError:
            return 1


def serve(env_class: type) -> None:
    """Serve ``env_class`` over stdin and stdout until stdin closes (a user's own host script).

    For ``env: {name: external, command: [python, my_env.py], config: {...}}``: the
    script ends with ``if __name__ == "__main__": petting_env.serve(MyEnv)``; hello's
    ``config`` is passed to the class.
    """
    code = run(env_class)
    if code:
        sys.exit(code)


def main() -> int:
    return run()


if __name__ == "__main__":
    sys.exit(main())
