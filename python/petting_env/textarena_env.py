"""TextArena games as petting environments (``env: {name: textarena, game: TicTacToe-v0}``).

The ``env:`` mapping:

- ``game``: a registered TextArena id (``TicTacToe-v0``, ``ConnectFour-v0``,
  ``KuhnPoker-v0``, ``Nim-v0``; an id ending ``-train`` or ``-raw`` picks TextArena's
  other observation wrappers), or an entry point ``module:Class`` for a game that
  textarena ships but does not register (``textarena.envs.Hanabi.env:HanabiEnv`` in
  0.7.4), which gets the wrappers registered games get by default.
- ``players``: how many players (default 2); the agents are ``player_0`` … ``player_{N-1}``.
- ``invalid_move_penalty``: the mover's local reward for an invalid move (default -1.0).
- ``kwargs``: a mapping passed to the game's constructor (``ta.make(game, **kwargs)``).
- ``history``: ``full`` (default) or ``latest`` (below).
- ``reward``: ``outcome`` (default) or ``score`` (below).

Task rows are ``{"seed": k}``; ``reset`` passes ``k`` to TextArena (the seed of
``make`` when the row has none).

What petting sees, against textarena 0.7.4's API (``ta.make``, ``reset(num_players,
seed)``, ``get_observation() -> (player_id, observation)``, ``step(action) -> (done,
info)``, ``close() -> (rewards, game_info)``):

- The observation is the text TextArena gives the player. With the default wrappers it
  is already text: every message the player has been shown so far, one per line,
  ``[GAME] …`` or ``[Player k] …``. Without a wrapper (``-raw`` ids) TextArena gives a
  list of new ``(sender, message, kind)`` messages; they are kept per player and joined
  the same way, so the observation always holds the whole game so far.
- With ``history: latest`` the game is made without TextArena's observation wrapper
  (a registered id's ``-raw`` variant) and a player sees the game's opening prompt (the
  rules) and the messages since its previous turn ended (a move accepted, or the turn
  passed on after rejected ones), joined the same way. A rejected move it must retry
  keeps what came before it: the player still sees the state it is asked to move in,
  and why its reply was rejected.
- Invalid moves follow TextArena's own rules (its error allowance: by default a player
  may resubmit once, the second invalid move in a row loses the game). A step whose
  reply TextArena rejected has ``invalid: true``, the mover gets
  ``invalid_move_penalty`` in ``rewards``, and ``feedback`` says why.
- On the final step ``rewards`` holds every player's final reward from TextArena (win
  +1, loss -1, draw 0 in two-player games), plus the penalty for the mover if the final
  move was invalid. ``team_reward`` is the mean of the final rewards: 0 in zero-sum
  games (the team as a whole gains nothing when one member beats another), the shared
  score in cooperative ones; 0 on every other step.
- ``success`` (final step only) means player_0 did at least as well as every other
  player, a win or a draw; in a one-player game, that its final reward reached 1 (the
  game was solved, not merely partly done).
- With ``reward: score`` (games that keep a running score: Hanabi's ``_calculate_scores``,
  the fireworks played, 0 to 25) ``team_reward`` is the score after every step, the
  mover's reward is what its move added to it (plus the penalty for an invalid move),
  and ``success`` means TextArena declared the players winners (Hanabi: all five
  fireworks complete). A game cut off before its end keeps the score it reached.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, Callable

from .env import Env, StepResult, task_seed

DEFAULT_PLAYERS = 2
DEFAULT_INVALID_MOVE_PENALTY = -1.0
HISTORIES = ("full", "latest")
REWARDS = ("outcome", "score")


class InvalidMoves:
    """Stands in for a TextArena state's ``set_invalid_move`` to count rejected moves.

    Every TextArena game reports an invalid move through its state's
    ``set_invalid_move(reason)``, whichever state class it uses, while the state's own
    flags are reset before ``step`` returns; counting the calls is the one way to tell
    that a step was rejected. It holds the bound method, so a deepcopy of the state
    copies it along with the state.
    """

    def __init__(self, method: Callable[..., Any]) -> None:
        self.method = method
        self.count = 0
        self.reason = ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        self.reason = str(kwargs.get("reason", args[0] if args else ""))
        return self.method(*args, **kwargs)


def make_game(config: dict[str, Any]) -> Any:
    """A fresh TextArena environment for ``config["game"]``, wrapped as TextArena wraps it."""
    import textarena as ta

    game = config.get("game")
    if not isinstance(game, str) or not game:
        raise ValueError("env.game must name a TextArena game, e.g. 'TicTacToe-v0'")
    kwargs = config.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"env.kwargs must be a mapping, got {kwargs!r}")
    latest = choice_of(config, "history", HISTORIES) == "latest"
    if ":" in game:
        module, _, class_name = game.partition(":")
        env = getattr(importlib.import_module(module), class_name)(**kwargs)
        wrappers = [ta.wrappers.ActionFormattingWrapper]
        if not latest:
            wrappers.insert(0, ta.wrappers.LLMObservationWrapper)
        for wrapper in wrappers:
            env = wrapper(env)
        return env
    from textarena.envs.registration import ENV_REGISTRY

    if game not in ENV_REGISTRY:
        raise ValueError(f"TextArena {ta.__version__} has no game {game!r}")
    if latest and not game.endswith("-raw"):
        if game.endswith("-train") or f"{game}-raw" not in ENV_REGISTRY:
            raise ValueError(f"env.history: latest needs {game}'s raw messages; give its -raw id or history: full")
        game = f"{game}-raw"
    return ta.make(game, **kwargs)


def choice_of(config: dict[str, Any], key: str, choices: tuple[str, ...]) -> str:
    value = config.get(key, choices[0])
    if value not in choices:
        raise ValueError(f"env.{key} must be one of {', '.join(choices)}, got {value!r}")
    return value


def scorer_of(game: Any) -> Callable[[], float]:
    """The running score of a game that keeps one (reward: score)."""
    unwrapped = game
    while hasattr(unwrapped, "env"):
        unwrapped = unwrapped.env
    score = getattr(unwrapped, "_calculate_scores", None)
    if not callable(score):
        raise ValueError(
            f"env.reward: score needs a game that keeps a running score (TextArena's Hanabi does); "
            f"{type(unwrapped).__name__} does not: use reward: outcome"
        )
    return lambda: float(score())


def players_of(config: dict[str, Any]) -> int:
    players = config.get("players", DEFAULT_PLAYERS)
    if isinstance(players, bool) or not isinstance(players, int) or players < 1:
        raise ValueError(f"env.players must be a whole number of players, got {players!r}")
    return players


def penalty_of(config: dict[str, Any]) -> float:
    penalty = config.get("invalid_move_penalty", DEFAULT_INVALID_MOVE_PENALTY)
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not math.isfinite(penalty):
        raise ValueError(f"env.invalid_move_penalty must be a number, got {penalty!r}")
    return float(penalty)


class TextArenaEnv(Env):
    """One TextArena game; see the module's docstring for what petting sees."""

    @classmethod
    def agents(cls, config: dict[str, Any]) -> list[str]:  # type: ignore[override]
        return [f"player_{index}" for index in range(players_of(config))]

    @classmethod
    def validate(cls, config: dict[str, Any]) -> None:
        """Make and reset the game once, so a wrong id or player count fails at hello."""
        penalty_of(config)
        game = make_game(config)
        game.reset(num_players=players_of(config), seed=0)
        if choice_of(config, "reward", REWARDS) == "score":
            scorer_of(game)

    @classmethod
    def tasks(cls, config: dict[str, Any], split: str, count: int, seed: int) -> list[dict[str, Any]]:
        base = task_seed(seed, split)
        return [{"seed": base + index} for index in range(count)]

    def reset(self, task: dict[str, Any], seed: int) -> None:
        game_seed = task.get("seed", seed)
        if isinstance(game_seed, bool) or not isinstance(game_seed, int):
            raise ValueError(f"a TextArena task's seed must be an integer, got {game_seed!r}")
        self.players = players_of(self.config)
        self.penalty = penalty_of(self.config)
        self.game = make_game(self.config)
        self.game.reset(num_players=self.players, seed=game_seed)
        self.latest = choice_of(self.config, "history", HISTORIES) == "latest"
        # A flag, not the bound scorer: a fork must read its own copy of the game.
        self.scored = choice_of(self.config, "reward", REWARDS) == "score"
        self.opening: dict[int, list[str]] = {}  # the prompt messages, kept in latest mode
        self.transcripts: dict[int, list[str]] = {}  # for unwrapped games
        self.done = False
        self.turn = self._read_turn()

    def observe(self) -> tuple[str, str] | None:
        if self.done:
            return None
        return f"player_{self.turn[0]}", self.turn[1]

    def step(self, reply: str) -> StepResult:
        mover = self.turn[0]
        invalid_moves = self._invalid_moves()
        rejected_before = invalid_moves.count
        score_before = scorer_of(self.game)() if self.scored else 0.0
        done, _info = self.game.step(reply)
        invalid = invalid_moves.count > rejected_before
        if self.latest and not invalid:
            self.transcripts[mover] = []

        rewards: dict[str, float] = {f"player_{mover}": self.penalty if invalid else 0.0}
        feedback = [f"Invalid move: {invalid_moves.reason}"] if invalid else []
        result = StepResult(rewards=rewards, invalid=invalid)
        if self.scored:
            score = scorer_of(self.game)()
            rewards[f"player_{mover}"] += score - score_before
            result.team_reward = score
        if done:
            self.done = True
            final, reasons = self._close()
            result.done = True
            others = [reward for player, reward in final.items() if player != 0]
            result.success = final[0] >= max(others) if others else final[0] >= 1.0
            if self.scored:
                result.success = final[0] > 0
            else:
                for player, reward in final.items():
                    rewards[f"player_{player}"] = reward + (self.penalty if invalid and player == mover else 0.0)
                result.team_reward = sum(final.values()) / self.players
            feedback += reasons
        else:
            self.turn = self._read_turn()
            if self.latest and self.turn[0] != mover:  # its turn is over, even if skipped
                self.transcripts[mover] = []
        result.feedback = "\n".join(feedback)
        return result

    def _read_turn(self) -> tuple[int, str]:
        """Read the next turn once: TextArena hands each message out only once."""
        player, observation = self.game.get_observation()
        if isinstance(observation, str):
            return player, observation.lstrip("\n")
        import textarena as ta

        opening = self.opening.setdefault(player, [])
        transcript = self.transcripts.setdefault(player, [])
        roles = getattr(self.game.state, "role_mapping", {})
        for sender, message, *kind in observation:
            name = "GAME" if sender == -1 else roles.get(sender, f"Player {sender}")
            line = f"[{name}] {message}"
            (opening if self.latest and kind and kind[0] == ta.ObservationType.PROMPT else transcript).append(line)
        return player, "\n".join(opening + transcript)

    def _invalid_moves(self) -> InvalidMoves:
        """The counter on the game's state, installed on first use (games may replace their state)."""
        state = self.game.state
        counter = state.__dict__.get("set_invalid_move")
        if not isinstance(counter, InvalidMoves):
            counter = InvalidMoves(state.set_invalid_move)
            state.set_invalid_move = counter
        return counter

    def _close(self) -> tuple[dict[int, float], list[str]]:
        """Every player's final reward (0 where TextArena gave none) and why the game ended."""
        closed = self.game.close()
        rewards, game_info = closed if isinstance(closed, tuple) and len(closed) == 2 else (closed, {})
        if rewards is None:
            rewards = getattr(self.game.state, "rewards", None) or {}
        final = {player: float(rewards.get(player, 0.0)) for player in range(self.players)}
        reasons: list[str] = []
        for info in (game_info or {}).values():
            reason = info.get("reason") if isinstance(info, dict) else None
            if reason and str(reason) not in reasons:
                reasons.append(str(reason))
        return final, reasons
