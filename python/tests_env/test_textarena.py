"""TextArena games through the host, over stdio, with the network cut."""

from __future__ import annotations

import unittest

from hostproc import HostProcess, hello

TICTACTOE = {"name": "textarena", "game": "TicTacToe-v0", "players": 2}


class TicTacToeTest(unittest.TestCase):
    host: HostProcess

    @classmethod
    def setUpClass(cls) -> None:
        cls.host = HostProcess()
        cls.hello = hello(cls.host, TICTACTOE)

    @classmethod
    def tearDownClass(cls) -> None:
        assert cls.host.close() == 0

    def make(self, episode_id: str, seed: int = 1) -> dict:
        [turn] = self.host.items("make", {"id": episode_id, "task": {"seed": seed}, "seed": 7})
        self.assertNotIn("error", turn)
        return turn

    def step(self, episode_id: str, reply: str) -> dict:
        [step] = self.host.items("step", {"id": episode_id, "reply": reply})
        self.assertNotIn("error", step)
        return step

    def test_hello_names_the_players(self) -> None:
        self.assertEqual(self.hello, {"ok": True, "protocol": 1, "agents": ["player_0", "player_1"], "turn_order": "env"})

    def test_tasks_are_seeds_reproducible_and_split(self) -> None:
        train = self.host.ok(op="tasks", split="train", count=3, seed=11)["tasks"]
        again = self.host.ok(op="tasks", split="train", count=3, seed=11)["tasks"]
        test = self.host.ok(op="tasks", split="test", count=3, seed=11)["tasks"]
        self.assertEqual(train, again)
        self.assertEqual(len(train), 3)
        self.assertTrue(all(set(row) == {"seed"} and isinstance(row["seed"], int) for row in train))
        self.assertFalse({row["seed"] for row in train} & {row["seed"] for row in test})

    def test_full_game_with_an_invalid_move(self) -> None:
        turn = self.make("game")
        self.assertEqual(turn["agent"], "player_0")
        self.assertFalse(turn["done"])
        self.assertIn("Tic Tac Toe", turn["observation"])
        self.assertIn("Available Moves", turn["observation"])

        step = self.step("game", "I take the centre: [4]")
        self.assertEqual(step["rewards"], {"player_0": 0.0})
        self.assertFalse(step["invalid"] or step["done"])
        self.assertEqual(step["next"]["agent"], "player_1")
        self.assertIn("Player 0 placed their symbol", step["next"]["observation"])

        step = self.step("game", "no idea")  # TextArena allows one retry
        self.assertTrue(step["invalid"])
        self.assertEqual(step["rewards"], {"player_1": -1.0})
        self.assertIn("Invalid move", step["feedback"])
        self.assertFalse(step["done"])
        self.assertEqual(step["next"]["agent"], "player_1")
        self.assertIn("attempted an invalid move", step["next"]["observation"])

        for agent, move in [("player_1", "[0]"), ("player_0", "[1]"), ("player_1", "[2]")]:
            self.assertEqual(step["next"]["agent"], agent)
            step = self.step("game", move)
            self.assertFalse(step["done"] or step["invalid"])
        step = self.step("game", "[7]")  # 1, 4, 7: player_0's column
        self.assertTrue(step["done"])
        self.assertIsNone(step["next"])
        self.assertEqual(step["rewards"], {"player_0": 1.0, "player_1": -1.0})
        self.assertEqual(step["team_reward"], 0.0)
        self.assertTrue(step["success"])
        self.assertIn("won", step["feedback"])

        [error] = self.host.items("step", {"id": "game", "reply": "[8]"})
        self.assertIn("finished", error["error"])

    def test_two_invalid_moves_lose_the_game(self) -> None:
        self.make("loser")
        first = self.step("loser", "pass")
        second = self.step("loser", "pass again")
        self.assertTrue(first["invalid"] and second["invalid"])
        self.assertTrue(second["done"])
        self.assertEqual(second["rewards"], {"player_0": -2.0, "player_1": 1.0})  # loss plus the penalty
        self.assertFalse(second["success"])

    def test_a_draw_is_a_success(self) -> None:
        self.make("draw")
        moves = ["[4]", "[0]", "[1]", "[7]", "[2]", "[6]", "[3]", "[5]", "[8]"]
        for move in moves:
            step = self.step("draw", move)
        self.assertTrue(step["done"])
        self.assertEqual(step["rewards"], {"player_0": 0.0, "player_1": 0.0})
        self.assertTrue(step["success"])

    def test_fork_is_independent(self) -> None:
        self.make("original")
        self.step("original", "[4]")
        self.assertEqual(self.host.items("fork", {"id": "original", "new": "original/0"}), [{}])
        forked = self.step("original/0", "[0]")
        self.assertIn("Player 1 placed their symbol (X) in cell 0", forked["next"]["observation"])

        # The original never saw the fork's move: cell 0 is still free there.
        step = self.step("original", "[0]")
        self.assertFalse(step["invalid"])
        self.assertEqual(step["next"]["agent"], "player_0")
        self.assertEqual(step["next"]["observation"].count("cell 0."), 1)
        # And the fork never saw this one: player_0 to move, board with one X in cell 0.
        step = self.step("original/0", "[8]")
        self.assertFalse(step["invalid"])

    def test_item_errors_leave_the_other_items_alone(self) -> None:
        self.make("fine")
        made = self.host.items("make", {"id": "fine", "task": {"seed": 1}, "seed": 1}, {"id": "fine2", "task": {}, "seed": 3})
        self.assertIn("already exists", made[0]["error"])
        self.assertFalse(made[1]["done"])
        steps = self.host.items("step", {"id": "nobody", "reply": "[4]"}, {"id": "fine", "reply": "[4]"}, {"id": "fine"})
        self.assertIn("unknown episode id 'nobody'", steps[0]["error"])
        self.assertNotIn("error", steps[1])
        self.assertIn("reply", steps[2]["error"])
        forks = self.host.items("fork", {"id": "nobody", "new": "x"}, {"id": "fine", "new": "fine2"})
        self.assertIn("unknown", forks[0]["error"])
        self.assertIn("already exists", forks[1]["error"])
        self.assertEqual(self.host.ok(op="drop", ids=["fine", "fine2", "never"]), {"ok": True})
        [error] = self.host.items("step", {"id": "fine", "reply": "[0]"})
        self.assertIn("unknown", error["error"])


class OtherGamesTest(unittest.TestCase):
    """Each game makes, forks, and replays the same moves in both copies alike."""

    def replay(self, env: dict, moves: list[str]) -> tuple[list[dict], HostProcess]:
        host = HostProcess()
        hello(host, env)
        host.items("make", {"id": "a", "task": {"seed": 3}, "seed": 3})
        host.items("fork", {"id": "a", "new": "b"})
        runs = {}
        for episode in ("b", "a"):  # the fork first: the original must not notice
            steps = []
            for move in moves:
                [step] = host.items("step", {"id": episode, "reply": move})
                self.assertNotIn("error", step, step)
                steps.append(step)
                if step["done"]:
                    break
            runs[episode] = steps
        self.assertEqual(runs["a"], runs["b"])
        self.assertEqual(host.close(), 0)
        return runs["a"], host

    def test_connect_four(self) -> None:
        steps, _ = self.replay({"name": "textarena", "game": "ConnectFour-v0"},
                               ["[col 3]", "[col 3]", "[col 4]", "[col 4]", "[col 5]", "[col 5]", "[col 6]"])
        self.assertTrue(steps[-1]["done"])
        self.assertEqual(steps[-1]["rewards"], {"player_0": 1.0, "player_1": -1.0})

    def test_kuhn_poker_deals_the_same_cards_in_a_fork(self) -> None:
        # 15 rounds, each dealt by TextArena from Python's global random: the fork replays
        # them only because the host gives every episode its own random state.
        steps, _ = self.replay({"name": "textarena", "game": "KuhnPoker-v0-long"}, ["[check]"] * 30)
        self.assertEqual(len(steps), 30)
        self.assertTrue(steps[-1]["done"])
        self.assertEqual(sum(steps[-1]["rewards"].values()), 0.0)
        self.assertEqual(steps[-1]["team_reward"], 0.0)

    def test_nim(self) -> None:
        steps, _ = self.replay({"name": "textarena", "game": "Nim-v0"}, ["[0 3]", "[1 4]", "[2 5]"])
        self.assertTrue(steps[-1]["done"])
        self.assertTrue(steps[-1]["success"])

    def test_hanabi_by_entry_point(self) -> None:
        """textarena 0.7.4 ships Hanabi without registering it: named by its class it runs."""
        env = {"name": "textarena", "game": "textarena.envs.Hanabi.env:HanabiEnv", "players": 2}
        steps, _ = self.replay(env, ["[Discard] 0", "[Play] 0"])
        self.assertEqual(len(steps), 2)
        self.assertTrue(steps[0]["next"]["observation"].startswith("[GAME] You are Player"))

    def test_hanabi_scores_its_fireworks_in_a_prompt_that_does_not_grow(self) -> None:
        env = {"name": "textarena", "game": "textarena.envs.Hanabi.env:HanabiEnv", "players": 2,
               "history": "latest", "reward": "score"}
        # Three wrong plays, then player_1 plays its white 1 (seed 3's deal).
        steps, _ = self.replay(env, ["[Play] 0", "[Play] 0", "[Play] 0", "[Play] 4", "[Discard] 0"])
        self.assertEqual([step["team_reward"] for step in steps], [0.0, 0.0, 0.0, 1.0, 1.0])
        self.assertEqual(steps[3]["rewards"], {"player_1": 1.0})
        self.assertEqual(steps[4]["rewards"], {"player_0": 0.0})
        # player_1 twice rejected (its turn skipped), then both play on.
        skipped, _ = self.replay(env, ["[Play] 0", "no move", "no move", "[Play] 0", "[Discard] 1", "[Discard] 2"])
        self.assertEqual([step["invalid"] for step in skipped], [False, True, True, False, False, False])
        self.assertEqual([step["next"]["agent"] for step in skipped][:4], ["player_1", "player_1", "player_0", "player_1"])
        # Each turn: the rules once and the state the player moves in once, however
        # many moves came before or were rejected.
        for step in steps + skipped:
            observation = step["next"]["observation"]
            self.assertEqual(observation.count("Key Rules:"), 1, observation)
            self.assertEqual(observation.count("Current game state:"), 1, observation)

    def test_a_score_needs_a_game_that_keeps_one(self) -> None:
        host = HostProcess()
        env = {"name": "textarena", "game": "TicTacToe-v0", "reward": "score"}
        response = host.request(op="hello", protocol=1, env=env, workdir="/")
        self.assertFalse(response["ok"])
        self.assertIn("reward: score needs a game that keeps a running score", response["error"])
        self.assertEqual(host.close(), 0)

    def test_unknown_game_is_refused_at_hello(self) -> None:
        host = HostProcess()
        response = host.request(op="hello", protocol=1, env={"name": "textarena", "game": "NoSuchGame-v0"}, workdir="/")
        self.assertFalse(response["ok"])
        self.assertIn("NoSuchGame-v0", response["error"])
        response = host.request(op="hello", protocol=1, env={"name": "textarena", "game": "TicTacToe-v0", "players": 3}, workdir="/")
        self.assertFalse(response["ok"])
        self.assertIn("number of players", response["error"])
        self.assertEqual(host.close(), 0)


if __name__ == "__main__":
    unittest.main()
