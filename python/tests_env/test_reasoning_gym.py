"""reasoning-gym datasets through the host, over stdio, with the network cut."""

from __future__ import annotations

import unittest

from hostproc import HostProcess, hello

ARITHMETIC = {"name": "reasoning_gym", "dataset": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 3}}


class ReasoningGymTest(unittest.TestCase):
    host: HostProcess

    @classmethod
    def setUpClass(cls) -> None:
        cls.host = HostProcess()
        cls.hello = hello(cls.host, ARITHMETIC)

    @classmethod
    def tearDownClass(cls) -> None:
        assert cls.host.close() == 0

    def tasks(self, split: str, seed: int, count: int = 4) -> list[dict]:
        return self.host.ok(op="tasks", split=split, count=count, seed=seed)["tasks"]

    def test_one_agent(self) -> None:
        self.assertEqual(self.hello["agents"], ["agent"])

    def test_tasks_are_reproducible_and_split(self) -> None:
        train = self.tasks("train", 5)
        self.assertEqual(len(train), 4)
        self.assertEqual(train, self.tasks("train", 5))
        self.assertTrue(all({"question", "answer", "metadata"} <= row.keys() for row in train))
        test = self.tasks("test", 5)
        self.assertFalse({row["question"] for row in train} & {row["question"] for row in test})
        self.assertNotEqual(train, self.tasks("train", 6))
        self.assertEqual(self.tasks("train", 5, count=0), [])

    def test_score_uses_the_dataset(self) -> None:
        task = self.tasks("train", 1, count=1)[0]
        right, wrong, missing = self.host.ok(op="score", items=[
            {"task": task, "reply": f"so... #### {task['answer']}", "answer": task["answer"]},
            {"task": task, "reply": "#### 123456789", "answer": "123456789"},
            {"task": task, "reply": "no marker", "answer": None},
        ])["scores"]
        self.assertEqual(right, 1.0)
        self.assertLess(wrong, 1.0)
        self.assertEqual(missing, 0.0)

    def test_one_turn_episode(self) -> None:
        task = self.tasks("test", 3, count=1)[0]
        [turn] = self.host.items("make", {"id": "q", "task": task, "seed": 0}, )
        self.assertEqual(turn, {"agent": "agent", "observation": task["question"], "done": False})
        self.host.items("fork", {"id": "q", "new": "q/1"})
        right, wrong = self.host.items("step", {"id": "q", "reply": f"#### {task['answer']}"},
                                       {"id": "q/1", "reply": "#### -1.5"})
        self.assertEqual((right["rewards"], right["done"], right["success"], right["next"]),
                         ({"agent": 1.0}, True, True, None))
        self.assertEqual((wrong["rewards"], wrong["success"]), ({"agent": 0.0}, False))

    def test_bad_configuration_is_refused_at_hello(self) -> None:
        host = HostProcess()
        for env, words in [({"name": "reasoning_gym", "dataset": "no_such_dataset"}, "no_such_dataset"),
                           ({**ARITHMETIC, "config": {"seed": 3}}, "seed")]:
            response = host.request(op="hello", protocol=1, env=env, workdir="/")
            self.assertFalse(response["ok"])
            self.assertIn(words, response["error"])
        self.assertEqual(host.close(), 0)


if __name__ == "__main__":
    unittest.main()
