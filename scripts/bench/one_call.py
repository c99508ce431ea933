"""The agent program of scripts/bench/agent-programs.sh: one call with the task's prompt
as the role's user message, as the built-in single-agent workflow sends it."""
import json, os, urllib.request

task = json.loads(os.environ["PETTING_TASK"])
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": "agent", "messages": [{"role": "user", "content": task["prompt"]}]}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
with urllib.request.urlopen(request) as response:
    json.load(response)
print(json.dumps({"reward": 0.0}))
