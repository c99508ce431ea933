"""The same two-role team with the `openai` client: `OpenAI()` reads OPENAI_BASE_URL and
OPENAI_API_KEY from the environment petting sets, and `model` names the role. The solver
answers, is asked once more with its first answer kept in the conversation, and the
checker gives the final answer."""
from openai import OpenAI

from verdict import TASK, verdict

client = OpenAI()


def chat(role, messages):
    return client.chat.completions.create(model=role, messages=messages).choices[0].message.content


messages = [{"role": "user", "content": TASK["question"] + " Give only the number."}]
messages.append({"role": "assistant", "content": chat("solver", messages)})
messages.append({"role": "user", "content": "Are you sure? Give only the number."})
answer = chat("solver", messages)
final = chat("checker", [{"role": "user", "content": f"Question: {TASK['question']}\n"
                          f"Proposed answer: {answer}\nGive the correct answer, only the number."}])
verdict(answer, final)
