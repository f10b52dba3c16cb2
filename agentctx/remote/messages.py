"""The conversation as OpenAI's API takes it: an assistant's tool calls with ids and their
arguments as JSON text, each tool result naming its call's id, and no "token_ids" (the
embedded engine's pinned answer ids, which a remote server cannot use)."""

from __future__ import annotations

import json


def api_messages(messages: list[dict]) -> list[dict]:
    out: list[dict] = []
    waiting: list[str] = []  # the ids of the last assistant's calls not yet answered
    number = 0
    for m in messages:
        m = {k: v for k, v in m.items() if k != "token_ids"}
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                number += 1
                fn = call.get("function", {})
                args = fn.get("arguments", {})
                calls.append({"id": call.get("id") or f"call_{number}", "type": "function",
                              "function": {"name": fn.get("name", ""),
                                           "arguments": args if isinstance(args, str)
                                           else json.dumps(args)}})  # fmt: skip
            waiting = [c["id"] for c in calls]
            m["tool_calls"] = calls
        elif m.get("role") == "tool" and "tool_call_id" not in m:
            m["tool_call_id"] = waiting.pop(0) if waiting else f"call_{number}"
        out.append(m)
    return out
