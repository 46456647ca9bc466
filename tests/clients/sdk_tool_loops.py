"""Tool loops through the official Python SDKs against a running rollout-proxy.

Run by tests/agents.rs with the venv of scripts/install-agents.sh:
    python sdk_tool_loops.py http://127.0.0.1:PORT
The upstream behind the proxy calls the declared `lookup` tool, then answers with the secret
word its result names. Each scenario runs on a session of its own; the last line printed is
a JSON object naming them, so the test can check their nodes.
"""

import json

import anthropic
import openai
from proxy_session import BASE, RESPONSES_TOOLS, new_session

SECRET = "The secret word is MANGO"


ANTHROPIC_TOOLS = [
    {
        "name": "lookup",
        "description": "Looks a word up",
        "input_schema": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    }
]
QUESTION = "What is the secret word? Look it up."


def anthropic_loop(stream):
    uuid = new_session()
    client = anthropic.Anthropic(base_url=f"{BASE}/{uuid}", api_key="test")
    messages = [{"role": "user", "content": QUESTION}]

    def ask():
        if not stream:
            return client.messages.create(
                model="claude-sonnet-4-5", max_tokens=256, tools=ANTHROPIC_TOOLS, messages=messages
            )
        with client.messages.stream(
            model="claude-sonnet-4-5", max_tokens=256, tools=ANTHROPIC_TOOLS, messages=messages
        ) as events:
            text = "".join(events.text_stream)
            message = events.get_final_message()
        assert text == "".join(b.text for b in message.content if b.type == "text"), text
        return message

    first = ask()
    assert first.stop_reason == "tool_use", first
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.name == "lookup" and call.input == {"query": "secret"}, call
    assert call.id.startswith("toolu_"), call.id
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    messages.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": SECRET}]}
    )
    second = ask()
    assert second.stop_reason == "end_turn", second
    assert second.content[0].text == "The secret word is MANGO.", second
    return uuid


def responses_loop(stream):
    uuid = new_session()
    client = openai.OpenAI(base_url=f"{BASE}/{uuid}/v1", api_key="test")

    def ask(**kwargs):
        if not stream:
            return client.responses.create(model="gpt-5", tools=RESPONSES_TOOLS, **kwargs)
        with client.responses.stream(model="gpt-5", tools=RESPONSES_TOOLS, **kwargs) as events:
            kinds = [event.type for event in events]
            response = events.get_final_response()
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
        return response

    first = ask(input=QUESTION)
    assert first.status == "completed", first
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "lookup" and json.loads(call.arguments) == {"query": "secret"}, call
    output = {"type": "function_call_output", "call_id": call.call_id, "output": SECRET}
    if stream:
        # The Agents SDK's way: the whole conversation again, the output items included.
        items = [{"role": "user", "content": QUESTION}]
        items += [item.model_dump(exclude_none=True) for item in first.output]
        second = ask(input=items + [output])
    else:
        second = ask(input=[output], previous_response_id=first.id)
    assert second.output_text == "The secret word is MANGO.", second
    assert second.usage.input_tokens > first.usage.input_tokens
    return uuid


sessions = {
    "anthropic messages.create": anthropic_loop(stream=False),
    "anthropic messages.stream": anthropic_loop(stream=True),
    "openai responses.create + previous_response_id": responses_loop(stream=False),
    "openai responses.stream": responses_loop(stream=True),
}
print(json.dumps(sessions))
