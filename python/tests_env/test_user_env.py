"""User environments (by module path and by serve()), reward files, and the error paths."""

from __future__ import annotations

import sys
import unittest

from hostproc import EXAMPLES, FIXTURES, HOST, HostProcess, hello

GUESS = {"name": "external", "module": "guess_number:GuessNumber", "config": {"high": 10}}


def line_of(path, text: str) -> int:
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line)


class GuessNumberPlays:
    """The same game, whichever way the class was loaded."""

    host: HostProcess

    def test_plays_a_game(self) -> None:
        [turn] = self.host.items("make", {"id": "g", "task": {"secret": 7}, "seed": 1})
        self.assertEqual(turn["agent"], "alice")
        self.assertIn("between 1 and 10", turn["observation"])
        [step] = self.host.items("step", {"id": "g", "reply": "I guess 5"})
        self.assertEqual(step["rewards"], {"alice": 0.0})
        self.assertEqual(step["next"]["agent"], "bob")
        self.assertIn("alice guessed 5: the secret is higher", step["next"]["observation"])
        [step] = self.host.items("step", {"id": "g", "reply": "hmm"})
        self.assertTrue(step["invalid"])
        self.assertEqual(step["rewards"], {"bob": -0.1})
        self.assertEqual(self.host.items("fork", {"id": "g", "new": "g/1"}), [{}])
        [wrong] = self.host.items("step", {"id": "g/1", "reply": "9"})
        self.assertFalse(wrong["done"])
        [step] = self.host.items("step", {"id": "g", "reply": "7"})
        self.assertEqual(step["rewards"], {"alice": 1.0})
        self.assertEqual((step["team_reward"], step["done"], step["success"], step["next"]), (1.0, True, True, None))
        [step] = self.host.items("step", {"id": "g/1", "reply": "7"})  # the fork goes on alone
        self.assertEqual(step["rewards"], {"bob": 1.0})

    def test_tasks_and_seeded_secrets(self) -> None:
        train = self.host.ok(op="tasks", split="train", count=5, seed=2)["tasks"]
        self.assertEqual(train, self.host.ok(op="tasks", split="train", count=5, seed=2)["tasks"])
        self.assertTrue(all(1 <= row["secret"] <= 10 for row in train))
        # Without a secret in the task, the host-seeded random draws the same one per seed.
        first = self.host.items("make", {"id": "s1", "task": {}, "seed": 42}, {"id": "s2", "task": {}, "seed": 42})
        self.assertNotIn("error", first[0])
        guesses = [self.host.items("step", {"id": episode, "reply": "0"})[0]["feedback"] for episode in ("s1", "s2")]
        self.assertEqual(guesses[0], guesses[1])


class ModulePathTest(GuessNumberPlays, unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.host = HostProcess(HOST)
        cls.hello = hello(cls.host, GUESS, workdir=EXAMPLES)

    @classmethod
    def tearDownClass(cls) -> None:
        assert cls.host.close() == 0

    def test_hello(self) -> None:
        self.assertEqual(self.hello["agents"], ["alice", "bob"])


class ServeTest(GuessNumberPlays, unittest.TestCase):
    """The user's script is the host: python guess_number.py calls serve(GuessNumber)."""

    @classmethod
    def setUpClass(cls) -> None:
        command = [sys.executable, "guess_number.py"]
        cls.host = HostProcess(command, cwd=EXAMPLES)
        cls.hello = hello(cls.host, {"name": "external", "command": command, "config": {"high": 10}}, workdir=EXAMPLES)

    @classmethod
    def tearDownClass(cls) -> None:
        assert cls.host.close() == 0

    def test_hello(self) -> None:
        self.assertEqual(self.hello["agents"], ["alice", "bob"])


class RewardFileTest(unittest.TestCase):
    def test_reward_function_scores_and_its_errors_name_the_line(self) -> None:
        host = HostProcess(HOST)
        env = {"name": "external", "module": "petting_env.examples.guess_number:GuessNumber"}
        hello(host, env, workdir=FIXTURES, reward="rewards.py:exact")
        scores = host.ok(op="score", items=[
            {"task": {"answer": "42"}, "reply": " 42\n", "answer": None},
            {"task": {"answer": "42"}, "reply": "41", "answer": "41"},
            {"task": {"question": "no answer"}, "reply": "41", "answer": "41"},
            {"task": "not an object", "reply": "41", "answer": None},
        ])["scores"]
        self.assertEqual(scores[:2], [1.0, 0.0])
        self.assertIn("KeyError: 'answer'", scores[2]["error"])
        self.assertIn(f"rewards.py:{line_of(FIXTURES / 'rewards.py', 'return reply.strip()')}", scores[2]["error"])
        self.assertIn("task", scores[3]["error"])
        self.assertEqual(host.close(), 0)

    def test_a_host_of_rewards_only_scores_with_the_reward_function(self) -> None:
        host = HostProcess(HOST)
        hello(host, {"name": "rewards"}, workdir=FIXTURES, reward="rewards.py:exact")
        scores = host.ok(op="score", items=[{"task": {"answer": "7"}, "reply": "7", "answer": "7"}])["scores"]
        self.assertEqual(scores, [1.0])
        self.assertEqual(host.close(), 0)

    def test_missing_reward_function_is_refused_at_hello(self) -> None:
        host = HostProcess(HOST)
        response = host.request(op="hello", protocol=1, env=GUESS, workdir=str(EXAMPLES), reward="nowhere.py:fn")
        self.assertFalse(response["ok"])
        self.assertIn("nowhere.py", response["error"])
        hello(host, {**GUESS, "module": "petting_env.examples.guess_number:GuessNumber"}, workdir=FIXTURES,
              reward="rewards.py:exact")
        self.assertEqual(host.close(), 0)


class ErrorPathsTest(unittest.TestCase):
    host: HostProcess

    @classmethod
    def setUpClass(cls) -> None:
        cls.host = HostProcess(HOST)
        first = cls.host.request(op="make", items=[])
        assert not first["ok"] and "hello" in first["error"], first
        refused = cls.host.request(op="hello", protocol=3, env={"name": "external", "module": "noisy_env:Noisy"},
                                   workdir=str(FIXTURES))
        assert not refused["ok"] and "protocol [3] is not spoken" in refused["error"], refused
        unknown = cls.host.request(op="hello", protocol=1, env={"name": "gym"}, workdir=str(FIXTURES))
        assert not unknown["ok"] and "'gym'" in unknown["error"], unknown
        missing = cls.host.request(op="hello", protocol=1, env={"name": "external", "module": "no_such_module:X"},
                                   workdir=str(FIXTURES))
        assert not missing["ok"] and "no_such_module" in missing["error"], missing
        hello(cls.host, {"name": "external", "module": "noisy_env:Noisy"}, workdir=FIXTURES)

    @classmethod
    def tearDownClass(cls) -> None:
        assert cls.host.close() == 0

    def test_malformed_lines_are_answered_and_the_host_goes_on(self) -> None:
        for line in [b"{not json", b"[1, 2]", b"", "{\"op\": \"drop\", \"ids\": [\"\u00e9\"]}".encode("latin-1")]:
            response = self.host.send_line(line)
            self.assertFalse(response["ok"])
            self.assertIn("malformed", response["error"])
        self.assertTrue(self.host.ok(op="drop", ids=[])["ok"])

    def test_unknown_op_and_bad_requests(self) -> None:
        response = self.host.request(op="teleport")
        self.assertFalse(response["ok"])
        self.assertIn("unknown op 'teleport'", response["error"])
        response = self.host.request(op="step", items="e1")
        self.assertFalse(response["ok"])
        self.assertIn("items", response["error"])
        response = self.host.request(op="hello", protocol=1, env={"name": "external", "module": "noisy_env:Noisy"},
                                     workdir=str(FIXTURES))
        self.assertFalse(response["ok"])
        self.assertIn("already", response["error"])

    def test_prints_do_not_reach_the_protocol(self) -> None:
        [turn] = self.host.items("make", {"id": "n", "task": {}, "seed": 0})
        self.assertEqual(turn, {"agent": "solo", "observation": "count 0", "done": False})
        [step] = self.host.items("step", {"id": "n", "reply": "read stdin"})
        self.assertEqual(step["feedback"], "''")  # user code reads /dev/null, not petting's requests
        for _ in range(3):
            [step] = self.host.items("step", {"id": "n", "reply": "ok"})
        self.assertEqual((step["done"], step["success"], step["team_reward"], step["next"]), (True, True, 0.5, None))
        stderr = self.host.stderr_text()
        self.assertIn("reset is chatty", stderr)
        self.assertIn("a raw write to file descriptor 1", stderr)

    def test_exception_in_step_is_an_item_error_naming_the_line(self) -> None:
        self.host.items("make", {"id": "c", "task": {}, "seed": 0})
        crash, good, stranger, nan = self.host.items(
            "step",
            {"id": "c", "reply": "crash"},
            {"id": "c", "reply": "ok"},
            {"id": "c", "reply": "reward a stranger"},
            {"id": "c", "reply": "nan"},
        )
        line = line_of(FIXTURES / "noisy_env.py", "raise ValueError")
        self.assertIn("ValueError: cannot handle 'crash'", crash["error"])
        self.assertIn(f"noisy_env.py:{line} in explode", crash["error"])
        self.assertEqual(good["rewards"], {"solo": 1.0})
        self.assertIn("'stranger'", stranger["error"])
        self.assertIn("finite number", nan["error"])

    def test_tasks_and_score_say_what_the_class_lacks(self) -> None:
        response = self.host.request(op="tasks", split="train", count=2, seed=0)
        self.assertFalse(response["ok"])
        self.assertIn("Noisy has no tasks()", response["error"])
        response = self.host.request(op="tasks", split="validation", count=2, seed=0)
        self.assertFalse(response["ok"])
        response = self.host.request(op="score", items=[{"task": {}, "reply": "x", "answer": None}])
        self.assertFalse(response["ok"])
        self.assertIn("reward function", response["error"])

    def test_a_task_value_json_cannot_say_is_refused_naming_it(self) -> None:
        host = HostProcess(HOST)
        try:
            hello(host, {"name": "external", "module": "noisy_env:OddTasks"}, workdir=FIXTURES)
            response = host.request(op="tasks", split="train", count=2, seed=0)
            self.assertFalse(response["ok"])
            self.assertIn("row 0['weights'][1] is Fraction(1, 3) (Fraction)", response["error"])
        finally:
            host.close()

    def test_unknown_ids_and_finished_episodes(self) -> None:
        [error] = self.host.items("fork", {"id": "ghost", "new": "ghost/0"})
        self.assertIn("unknown episode id 'ghost'", error["error"])
        self.assertEqual(self.host.ok(op="drop", ids=["ghost", 3]), {"ok": True})


class FinishedAtMakeTest(unittest.TestCase):
    def test_make_of_a_finished_episode_answers_done(self) -> None:
        host = HostProcess(HOST)
        hello(host, {"name": "external", "module": "noisy_env.py:Finished"}, workdir=FIXTURES)
        [turn] = host.items("make", {"id": "f", "task": {}, "seed": 0})
        self.assertEqual(turn, {"done": True})
        [error] = host.items("step", {"id": "f", "reply": "x"})
        self.assertIn("finished", error["error"])
        self.assertEqual(host.close(), 0)


class SimultaneousTest(unittest.TestCase):
    """Protocol 2: a turn that asks two agents at once, and a step that takes both replies."""

    PAIR = {"name": "external", "module": "pair_env:Pair"}

    def test_two_agents_act_in_one_step(self) -> None:
        host = HostProcess(HOST)
        answer = host.ok(op="hello", protocol=1, protocols=[1, 2], env=self.PAIR, workdir=str(FIXTURES))
        self.assertEqual(answer["protocol"], 2)
        [turn] = host.items("make", {"id": "p", "task": {}, "seed": 0})
        self.assertEqual(turn, {"acting": [{"agent": "left", "observation": "You are left, round 0"},
                                           {"agent": "right", "observation": "You are right, round 0"}], "done": False})
        [one] = host.items("step", {"id": "p", "reply": "a"})
        self.assertIn("needs 'replies'", one["error"])
        [partial] = host.items("step", {"id": "p", "replies": {"left": "a"}})
        self.assertIn("a reply (text) of each agent asked, ['left', 'right']", partial["error"])
        [step] = host.items("step", {"id": "p", "replies": {"left": "a", "right": ""}})
        self.assertEqual(step["invalid"], ["right"])
        self.assertEqual(step["rewards"], {"left": 1.0, "right": 0.0, "judge": 0.5})
        self.assertEqual(step["next"]["acting"][0]["observation"], "You are left, round 1")
        [unasked] = host.items("step", {"id": "p", "replies": {"left": "judge", "right": "b"}})
        self.assertIn("marked the replies of ['judge'] invalid, but asked only ['left', 'right']", unasked["error"])
        self.assertEqual(host.close(), 0)

    def test_a_protocol_1_hello_cannot_ask_two_agents_at_once(self) -> None:
        host = HostProcess(HOST)
        self.assertEqual(hello(host, self.PAIR, workdir=FIXTURES)["protocol"], 1)
        [turn] = host.items("make", {"id": "p", "task": {}, "seed": 0})
        self.assertIn("which protocol 1 cannot say", turn["error"])
        self.assertEqual(host.close(), 0)


if __name__ == "__main__":
    unittest.main()
