"""A two-role team with nothing but the standard library (docs/own-agents.md): the
solver answers, is asked again with its first answer kept in the conversation, and the
checker gives the final answer. The last line printed is the verdict petting reads."""
import json, os, re, urllib.request

task = json.load(open(os.environ["PETTING_TASK_FILE"]))  # the task row: {"question": ..., "answer": ...}

def chat(role, messages):  # one call; `model` names the role
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": role, "messages": messages}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(request) as response:
        return json.load(response)["choices"][0]["message"]["content"]

def right(text):
    number = re.search(r"-?\d+", text or "")
    return 1.0 if number and int(number.group()) == int(task["answer"]) else 0.0

messages = [{"role": "user", "content": task["question"] + " Give only the number."}]
messages.append({"role": "assistant", "content": chat("solver", messages)})
messages.append({"role": "user", "content": "Are you sure? Give only the number."})
answer = chat("solver", messages)
final = chat("checker", [{"role": "user", "content": f"{task['question']} Proposed: {answer}. The number?"}])
print(json.dumps({"reward": right(final), "rewards": {"solver": right(answer), "checker": right(final)}}))
