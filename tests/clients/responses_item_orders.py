"""Every order of output items in a streamed Responses reply, read by the openai SDK's own
stream accumulator (`client.responses.stream`), which refuses an event stream whose indexes
disagree (`Duplicate response output index`).

Run by tests/agents.rs with the venv of scripts/install-agents.sh:
    python responses_item_orders.py http://127.0.0.1:PORT
The upstream behind the proxy writes, for a question naming an order, items in that order. The
last line printed is a JSON object naming each order's session, so the test can check its node.
"""

import json

import openai
from proxy_session import BASE, RESPONSES_TOOLS, new_session

# The item types each order gives, as the final response lists them.
ORDERS = {
    "reasoning-text": ["reasoning", "message"],
    "reasoning-call": ["reasoning", "function_call"],
    "text-call": ["message", "function_call"],
    "call-call": ["function_call", "function_call"],
}


def streamed(order):
    uuid = new_session({"reasoning": True})
    client = openai.OpenAI(base_url=f"{BASE}/{uuid}/v1", api_key="test")
    with client.responses.stream(model="gpt-5", tools=RESPONSES_TOOLS, input=f"order: {order}") as stream:
        events = list(stream)
        response = stream.get_final_response()
    # Each item is announced at the next free index, and every event of an item carries it.
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.output_index for e in added] == list(range(len(added))), (order, added)
    by_item = {e.item.id: e.output_index for e in added}
    for event in events:
        item_id = getattr(event, "item_id", None)
        if item_id is not None:
            assert event.output_index == by_item[item_id], (order, event)
    kinds = [item.type for item in response.output]
    assert kinds == ORDERS[order], (order, kinds)
    for item in response.output:
        if item.type == "message":
            assert item.content[0].text.strip(), (order, item)
    return uuid


print(json.dumps({order: streamed(order) for order in ORDERS}))
