"""The two-role team as a LangGraph `StateGraph` of two nodes, solve then check, each
calling a `ChatOpenAI` whose model names the role (langchain-openai reads OPENAI_BASE_URL
and OPENAI_API_KEY from the environment). LangSmith tracing is off."""
import os

os.environ.setdefault("LANGSMITH_TRACING", "false")
os.environ.setdefault("LANGCHAIN_TRACING_V2", "false")

from typing import TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from verdict import TASK, verdict

solver, checker = ChatOpenAI(model="solver"), ChatOpenAI(model="checker")


class State(TypedDict, total=False):
    question: str
    answer: str
    final: str


def solve(state):
    messages = [("system", "Solve the arithmetic problem. Reply with only the number."), ("human", state["question"])]
    first = solver.invoke(messages)
    # The solver's conversation goes on: its first answer and a second question.
    again = solver.invoke(messages + [first, ("human", "Are you sure? Give only the number.")])
    return {"answer": again.content}


def check(state):
    prompt = f"Question: {state['question']}\nProposed answer: {state['answer']}\nGive the correct answer, only the number."
    return {"final": checker.invoke([("human", prompt)]).content}


graph = StateGraph(State)
graph.add_node("solve", solve)
graph.add_node("check", check)
graph.add_edge(START, "solve")
graph.add_edge("solve", "check")
graph.add_edge("check", END)
result = graph.compile().invoke({"question": TASK["question"]})
verdict(result["answer"], result["final"])
