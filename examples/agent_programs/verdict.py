"""What the framework examples share: the task petting hands the program, and the
verdict it prints as its last line on stdout."""
import json
import os
import re

# The task row as JSON; for these examples {"question": "What is 17 + 25?", "answer": "42"}.
TASK = json.load(open(os.environ["PETTING_TASK_FILE"]))


def first_integer(text):
    """The first integer in `text`, or None."""
    number = re.search(r"-?\d+", text or "")
    return int(number.group()) if number else None


def verdict(solver_answer, final_answer, task=TASK):
    """Print the verdict: the team is rewarded for the checker's final answer, the
    solver for its own; petting reads only this last line of stdout."""
    def right(text):
        return 1.0 if first_integer(text) == int(task["answer"]) else 0.0

    reward = right(final_answer)
    line = {"reward": reward, "rewards": {"solver": right(solver_answer), "checker": reward}, "success": reward == 1.0}
    print(json.dumps(line), flush=True)
