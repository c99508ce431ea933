"""The two-role team with the OpenAI Agents SDK (`openai-agents`): each role is an `Agent`
whose model is an `OpenAIChatCompletionsModel` naming the role, on an `AsyncOpenAI()`
client that reads petting's endpoint from the environment. Tracing is off: nothing
leaves the machine but the calls to petting."""
import os

os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

import asyncio

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

from verdict import TASK, verdict

set_tracing_disabled(True)
client = AsyncOpenAI()
solver = Agent(name="solver", instructions="Solve the arithmetic problem. Reply with only the number.",
               model=OpenAIChatCompletionsModel(model="solver", openai_client=client))
checker = Agent(name="checker", instructions="Check the proposed answer. Reply with only the correct number.",
                model=OpenAIChatCompletionsModel(model="checker", openai_client=client))


async def main():
    first = await Runner.run(solver, TASK["question"])
    # The solver's conversation goes on: its first answer and a second question.
    again = await Runner.run(solver, first.to_input_list() + [{"role": "user", "content": "Are you sure?"}])
    checked = await Runner.run(checker, f"Question: {TASK['question']}\nProposed answer: {again.final_output}")
    verdict(again.final_output, checked.final_output)


asyncio.run(main())
