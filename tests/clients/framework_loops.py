"""Tool loops through agent frameworks against a running rollout-proxy, each with the way it
hands a call back: LangChain (re-serialises the arguments, drops reasoning, on Responses
drops item status), LangGraph's agent, the Agents SDK on both of its models, and the OpenAI
SDK's message appended as `model_dump()`, `model_dump(exclude_none=True)` and from its
stream helper.

Run by tests/agents.rs with the venv of scripts/install-agents.sh:
    python framework_loops.py http://127.0.0.1:PORT
The upstream behind the proxy calls the declared `lookup` tool, then answers with the secret
word its result names. Each scenario runs on a session of its own; the last line printed is a
JSON object naming them.
"""

import asyncio
import json

import openai
from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner
from agents import function_tool, set_tracing_disabled
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from proxy_session import BASE, new_session

SECRET = "The secret word is MANGO"
QUESTION = "What is the secret word? Look it up."
ANSWER = "The secret word is MANGO."
set_tracing_disabled(True)


@tool
def lookup(query: str) -> str:
    """Looks a word up."""
    assert query == "secret", query
    return SECRET


def langchain_loop(responses):
    uuid = new_session()
    model = ChatOpenAI(
        model="local-model",
        base_url=f"{BASE}/{uuid}/v1",
        api_key="test",
        use_responses_api=responses,
        max_retries=0,
    ).bind_tools([lookup])
    messages = [HumanMessage(QUESTION)]
    first = model.invoke(messages)
    assert first.tool_calls and first.tool_calls[0]["name"] == "lookup", first
    messages.append(first)
    call = first.tool_calls[0]
    messages.append(ToolMessage(lookup.invoke(call["args"]), tool_call_id=call["id"]))
    second = model.invoke(messages)
    assert ANSWER in second.text, second
    return uuid


def langgraph_agent():
    uuid = new_session()
    model = ChatOpenAI(model="local-model", base_url=f"{BASE}/{uuid}/v1", api_key="test", max_retries=0)
    agent = create_agent(model, tools=[lookup])
    result = agent.invoke({"messages": [HumanMessage(QUESTION)]})
    assert ANSWER in result["messages"][-1].text, result
    return uuid


@function_tool(name_override="lookup")
def agents_lookup(query: str) -> str:
    """Looks a word up."""
    assert query == "secret", query
    return SECRET


def agents_run(responses):
    uuid = new_session()
    client = openai.AsyncOpenAI(base_url=f"{BASE}/{uuid}/v1", api_key="test", max_retries=0)
    kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
    agent = Agent(name="finder", instructions="Be brief.", tools=[agents_lookup],
                  model=kind(model="local-model", openai_client=client))
    result = asyncio.run(Runner.run(agent, QUESTION))
    assert result.final_output == ANSWER, result.final_output
    return uuid


LOOKUP = [{"type": "function", "function": {
    "name": "lookup", "description": "Looks a word up",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]


def sdk_loop(hand_back):
    """The OpenAI SDK's chat loop, the assistant message appended as `hand_back` makes it."""
    uuid = new_session()
    client = openai.OpenAI(base_url=f"{BASE}/{uuid}/v1", api_key="test", max_retries=0)
    messages = [{"role": "user", "content": QUESTION}]
    if hand_back == "stream helper":
        with client.chat.completions.stream(model="m", messages=messages, tools=LOOKUP) as events:
            for _ in events:
                pass
            message = events.get_final_completion().choices[0].message
        echoed = message
    else:
        message = client.chat.completions.create(model="m", messages=messages, tools=LOOKUP).choices[0].message
        echoed = message.model_dump(exclude_none=hand_back == "model_dump(exclude_none=True)")
    call = message.tool_calls[0]
    messages += [echoed, {"role": "tool", "tool_call_id": call.id, "content": SECRET}]
    second = client.chat.completions.create(model="m", messages=messages, tools=LOOKUP)
    assert second.choices[0].message.content == ANSWER, second
    return uuid


sessions = {
    "langchain chat": langchain_loop(responses=False),
    "langchain responses": langchain_loop(responses=True),
    "langgraph create_agent": langgraph_agent(),
    "agents sdk chat": agents_run(responses=False),
    "agents sdk responses": agents_run(responses=True),
    "openai sdk model_dump()": sdk_loop("model_dump()"),
    "openai sdk model_dump(exclude_none=True)": sdk_loop("model_dump(exclude_none=True)"),
    "openai sdk stream helper": sdk_loop("stream helper"),
}
print(json.dumps(sessions))
