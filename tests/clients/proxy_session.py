"""What the client scripts share: the proxy's base URL (their first argument), a new session
on it, and the `lookup` tool in the Responses API's shape."""

import json
import sys
import urllib.request

BASE = sys.argv[1]

RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Looks a word up",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    }
]


def new_session(options=None):
    """A new session's id; `options` are its create options."""
    request = urllib.request.Request(
        f"{BASE}/sessions/create",
        data=json.dumps(options or {}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request) as reply:
        return json.load(reply)["uuid"]
