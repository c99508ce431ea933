"""The two-role team with AutoGen AgentChat: two `AssistantAgent`s, each on an
`OpenAIChatCompletionClient` whose model names the role. petting's roles are no
models AutoGen knows, so `model_info` says what they can do (plain text only)."""
import os

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import asyncio

from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.openai import OpenAIChatCompletionClient

from verdict import TASK, verdict

MODEL_INFO = {"vision": False, "function_calling": False, "json_output": False,
              "structured_output": False, "family": "unknown"}


def client(role):
    return OpenAIChatCompletionClient(model=role, base_url=os.environ["OPENAI_BASE_URL"],
                                      api_key=os.environ["OPENAI_API_KEY"], model_info=MODEL_INFO)


solver = AssistantAgent("solver", client("solver"),
                        system_message="Solve the arithmetic problem. Reply with only the number.")
checker = AssistantAgent("checker", client("checker"),
                         system_message="Check the proposed answer. Reply with only the correct number.")


async def main():
    await solver.run(task=TASK["question"])
    # The agent keeps its conversation: a second run continues it.
    answer = (await solver.run(task="Are you sure? Give only the number.")).messages[-1].content
    prompt = f"Question: {TASK['question']}\nProposed answer: {answer}"
    final = (await checker.run(task=prompt)).messages[-1].content
    verdict(answer, final)


asyncio.run(main())
