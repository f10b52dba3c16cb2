"""OpenAI's request and response shapes: a request body checked and turned into the engine's
terms (messages, tool schemas, SamplingParams), and the objects and chunks sent back. Every
problem with a request is an ApiError, sent as OpenAI's {"error": {...}} with a 4xx."""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from engine import SamplingParams

MAX_STOP_STRINGS = 4  # as OpenAI's API
ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error") -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status, message, param, code, kind)  # fmt: skip

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}  # fmt: skip


@dataclass(slots=True)
class ChatRequest:
    model: str
    messages: list[dict]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    tools: list[dict] | None = None  # the function schemas the template is given
    tool_names: list[str] = field(default_factory=list)


@dataclass(slots=True)
class CompletionRequest:
    model: str
    prompt: str | list[int]  # text, or token ids (OpenAI's token-array prompt)
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False  # vLLM's field: each choice also carries its token ids


def parse_chat(body: Any, window: int) -> ChatRequest:
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list of messages", "messages")
    tools, names = _tools(body)
    return ChatRequest(_model(body), [_message(m, i) for i, m in enumerate(messages)],
                       sampling_params(body, window), *_streaming(body), tools, names)  # fmt: skip


def parse_completion(body: Any, window: int) -> CompletionRequest:
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one prompt
    if not _token_ids(prompt) and (not isinstance(prompt, str) or not prompt):
        raise ApiError(400, "'prompt' must be a non-empty string or list of token ids "
                       "(one prompt)", "prompt")  # fmt: skip
    return CompletionRequest(_model(body), prompt, sampling_params(body, window), *_streaming(body),
                             _typed(body, "return_token_ids", bool, False))  # fmt: skip


def _token_ids(prompt: Any) -> bool:
    """Whether the prompt is a non-empty list of token ids (checked against the vocabulary
    where the model is known)."""
    return (isinstance(prompt, list) and bool(prompt)
            and all(type(t) is int and t >= 0 for t in prompt))  # fmt: skip


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required (a string)", "model")
    return model


def _streaming(body: dict) -> tuple[bool, bool]:
    stream = _typed(body, "stream", bool, False)
    options = _typed(body, "stream_options", dict, None) or {}
    return stream, bool(options.get("include_usage", False))


def _message(m: Any, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise ApiError(400, f"{where} must be an object with a role of {', '.join(ROLES)}", where)
    role = "system" if m["role"] == "developer" else m["role"]
    out: dict[str, Any] = {"role": role, "content": _content(m.get("content"), where)}
    if role == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = [_call_in(c, f"{where}.tool_calls") for c in m["tool_calls"]]
    for key in ("name", "tool_call_id"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    return out


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or the text parts of a list of parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type") != "text" for p in content):
            raise ApiError(400, f"{where}: only text content parts are supported", where)
        return "".join(str(p.get("text", "")) for p in content)
    raise ApiError(400, f"{where}.content must be a string or a list of text parts", where)


def _call_in(call: Any, where: str) -> dict:
    """An assistant's tool call as templates render it: arguments as an object."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(400, f"{where}: each call needs function.name", where)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise ApiError(400, f"{where}: arguments are not JSON", where) from None
    return {"id": call.get("id"), "type": "function",
            "function": {"name": fn["name"], "arguments": args}}  # fmt: skip


def _tools(body: dict) -> tuple[list[dict] | None, list[str]]:
    tools = _typed(body, "tools", list, None)
    choice = body.get("tool_choice", "auto")
    if not tools or choice == "none":
        return None, []
    fns = [t.get("function") if isinstance(t, dict) else None for t in tools]
    if any(not isinstance(f, dict) or not isinstance(f.get("name"), str) for f in fns):
        raise ApiError(400, "each tool must be {'type': 'function', 'function': {'name': ...}}",
                       "tools")  # fmt: skip
    if isinstance(choice, dict):  # one named function
        name = (choice.get("function") or {}).get("name")
        fns = [f for f in fns if f["name"] == name]
        if not fns:
            raise ApiError(400, f"tool_choice names no offered tool: {name!r}", "tool_choice")
    elif choice not in ("auto", "required"):
        raise ApiError(400, "tool_choice must be none, auto, required or a function",
                       "tool_choice")  # fmt: skip
    return [{"type": "function", "function": f} for f in fns], [f["name"] for f in fns]


def sampling_params(body: dict, window: int) -> SamplingParams:
    n = _typed(body, "n", int, 1)
    if n != 1:
        raise ApiError(400, "only n=1 is supported", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if max_tokens is None:
        max_tokens = window  # the engine cuts it to the room the prompt leaves
    elif type(max_tokens) is not int or not 1 <= max_tokens <= window:
        raise ApiError(400, f"'{param}' must be an integer from 1 to {window} (the window)",
                       param)  # fmt: skip
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) for s in stop)
    ):
        raise ApiError(400, f"'stop' must be a string or up to {MAX_STOP_STRINGS} strings", "stop")
    seed = _typed(body, "seed", int, None)
    return SamplingParams(max_tokens=max_tokens, stop=stop, seed=seed,
                          # vLLM's and llama-server's extra field: benchmarks fix the length
                          ignore_eos=_typed(body, "ignore_eos", bool, False),
                          temperature=_number(body, "temperature", 1.0, 0, 2),
                          top_p=_number(body, "top_p", 1.0, 0, 1, low_open=True),
                          # vLLM's and SGLang's extra field: agentctx ask --backend sends it
                          repetition_penalty=_number(body, "repetition_penalty", 1.0, 0, 2,
                                                     low_open=True))  # fmt: skip


def _number(body: dict, key: str, default: float, low: float, high: float,
            low_open: bool = False) -> float:  # fmt: skip
    value = body.get(key)
    if value is None:
        return default
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (low < value if low_open else low <= value) or value > high:
        raise ApiError(400, f"'{key}' must be a number from {low} to {high}", key)
    return float(value)


def _typed(body: dict, key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ApiError(400, f"'{key}' must be of type {kind.__name__}", key)
    return value


# -- responses ----------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(stats) -> dict:
    """OpenAI's usage object; cached_tokens is the reused prefix, 0 when none was."""
    prompt, done = stats.prompt_tokens, stats.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}  # fmt: skip


def tool_calls_out(calls) -> list[dict]:
    """Parsed calls (agentctx.tool_calls.ToolCallRecord) in OpenAI's shape."""
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in calls]  # fmt: skip


def chat_completion(rid: str, model: str, content: str | None, calls: list[dict],
                    finish: str, stats) -> dict:  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": None}],
            "usage": usage(stats)}  # fmt: skip


def chat_chunk(rid: str, model: str, delta: dict | None, finish: str | None = None,
               stats=None) -> dict:  # fmt: skip
    """One streamed chunk; delta None: the usage chunk (no choices)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish,
                                          "logprobs": None}]  # fmt: skip
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
             "model": model, "choices": choices}  # fmt: skip
    if stats is not None:
        chunk["usage"] = usage(stats)
    return chunk


def text_completion(rid: str, model: str, text: str | None, finish: str | None,
                    stats=None, token_ids: list[int] | None = None) -> dict:  # fmt: skip
    """A /v1/completions object, or one of its chunks (text None: the usage chunk); with
    token_ids, its choice carries them (return_token_ids)."""
    choices = [] if text is None else [{"index": 0, "text": text, "finish_reason": finish,
                                         "logprobs": None}]  # fmt: skip
    if choices and token_ids is not None:
        choices[0]["token_ids"] = token_ids
    out = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
           "choices": choices}  # fmt: skip
    if stats is not None:
        out["usage"] = usage(stats)
    return out


def finish_reason(engine_reason: str | None, has_calls: bool) -> str:
    if has_calls:
        return "tool_calls"
    return "length" if engine_reason == "length" else "stop"
