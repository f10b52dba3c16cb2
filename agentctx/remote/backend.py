"""`RemoteBackend`: the app's Backend (agentctx.backend) over an OpenAI-compatible server.
It packs with the server's token counts (tokens.py), runs each turn's tool loop through
the API (turn.py) on the session's replica (routing.py), and keeps no KV: the server's
prefix cache holds a session's conversation between turns, and `save_snapshot` does
nothing."""

from __future__ import annotations

import time
from dataclasses import dataclass

from agentctx.backend import Backend
from agentctx.remote.backend_config import BackendSpec
from agentctx.remote.client import OpenAIClient, RemoteError
from agentctx.remote.messages import api_messages
from agentctx.remote.tokens import PackingModel, TokenCounter, local_tokenizer
from agentctx.remote.turn import StepReply, run_remote_turn, stream_step

PROBE_KEY = ""  # the routing key of the requests made before a session is known
# What agentctx.agent.tool_format reads from a chat template, for packing: whether the
# model takes tools, and in which of the two formats (the server renders its own template)
TEMPLATE_SAYS = {None: None, "hermes": "tools <tool_call>", "json": "tools"}
PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "A probe.",
              "parameters": {"type": "object", "properties": {}}}}  # fmt: skip


@dataclass(slots=True)
class RemoteSession:
    """What a remote backend keeps of a session between turns: its id, the routing key."""

    session_id: str
    busy: bool = False

    def close(self) -> None:
        pass  # the server holds no state of it but its prefix cache


class StepHandle:
    """What on_stream gets for a step: cancel() ends it at its next chunk."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ToolsRefused(RemoteError):
    """The server rejected the tools field (no tool parser, a template without tools)."""


class RemoteBackend(Backend):
    def __init__(self, spec: BackendSpec, client: OpenAIClient, model: str, window: int,
                 counter: TokenCounter, tool_fmt: str | None) -> None:  # fmt: skip
        self.spec, self.client, self.model, self._window = spec, client, model, window
        self.counter, self.tool_fmt = counter, tool_fmt
        self.name = spec.name

    @classmethod
    def connect(cls, spec: BackendSpec) -> RemoteBackend:
        """Ask the server what it serves: the model (checked against --model), its window,
        how to count tokens, and whether the model takes tools."""
        client = OpenAIClient(spec)
        try:
            card = served_model(client, spec)
            model = card["id"]
            window = spec.window or window_of(client, card)
            counter = TokenCounter.for_backend(client, model, PROBE_KEY)
            return cls(spec, client, model, window, counter, tool_format_of(spec, counter))
        except BaseException:
            client.close()
            raise

    @property
    def window(self) -> int:
        return self._window

    def pack(self, turn, output, context_tokens=None, show_packing=False):
        from agentctx.ask import new_session_messages

        view = PackingModel(self.counter, self._window, TEMPLATE_SAYS[self.tool_fmt])
        packed = new_session_messages(view, turn.root, turn.question, turn.params,
                                      context_tokens, output, turn.kind, show_packing)  # fmt: skip
        if self.counter.estimate:
            output.info(f"token counts are {self.counter.describe()}")
        return packed

    def open_session(self, session, output) -> RemoteSession:
        import uuid

        return RemoteSession(session.id if session is not None else f"new-{uuid.uuid4().hex}")

    def run(self, turn, output, links):
        try:
            return run_remote_turn(self, turn, output, links)
        except ToolsRefused as e:
            self.tool_fmt = None
            output.info(f"the backend takes no tools ({e}); answering without them")
            return run_remote_turn(self, turn, output, links)

    def save_snapshot(self, es, session_id, output) -> None:
        """Nothing: a remote backend's KV lives in the server's prefix cache."""

    def prompt_tokens(self, turn, messages: list[dict]) -> int:
        """The tokens of a turn's first prompt over `messages`, as run_remote_turn sends it
        (the server's count where it has /tokenize, else the estimate packing uses)."""
        from agentctx.remote.turn import turn_prompt

        _, _, tools, convo = turn_prompt(self, turn, messages)
        return self.counter.chat_count(convo, tools)

    # -- the loop's steps (agentctx.remote.turn) --------------------------------------------

    def check_room(self, convo: list[dict], tools, tokens: int | None = None) -> int:
        """The prompt's tokens (`tokens`, where already counted); a prompt that fills the
        window is an error, as embedded."""
        from engine import ContextTooLongError

        if tokens is None:
            tokens = self.counter.chat_count(convo, tools)
        if tokens >= self._window:
            raise ContextTooLongError(tokens, self._window, what="the conversation")
        return tokens

    def step(self, convo, tools, fmt, turn, output, links, prompt_tokens: int) -> StepReply:
        """One streamed chat completion on the session's replica."""
        from agentctx.tool_calls import VisibleText, parse_tool_calls
        from tools.registry import BOOK_TOOLS, REPO_TOOLS

        names = BOOK_TOOLS if turn.kind == "book" else REPO_TOOLS
        body = request_body(self.model, convo, tools, turn.params, self._window - prompt_tokens)
        handle = StepHandle()
        if links.on_stream is not None:
            links.on_stream(handle)
        visible, start = VisibleText(fmt, names), time.perf_counter()
        try:
            with self.client.stream_chat(body, routing_key(links)) as chunks:
                reply, ttft, cancelled = stream_step(chunks, output, links.record, visible, handle)
        except RemoteError as e:
            if tools and e.status is not None and 400 <= e.status < 500 and "tool" in e.detail:
                raise ToolsRefused(e.detail, e.status, e.detail) from None
            raise
        calls = [parsed_call(c) for c in reply.tool_calls()]
        content = reply.content
        if not calls and fmt:  # a server without a tool parser leaves the call in the text
            content, calls = parse_tool_calls(content, fmt, names)
        rest = visible.end(content)
        if rest:
            output.text(rest)
        reason = "cancelled" if cancelled else reply.finish_reason or "stop"
        return StepReply(content, calls, "stop" if reason == "tool_calls" else reason,
                         reply.prompt_tokens, reply.cached_tokens, reply.completion_tokens, ttft,
                         time.perf_counter() - start)  # fmt: skip


def routing_key(links) -> str:
    """The stored session's id once the turn's record has it (a new session's first turn
    too), else the backend session's own id (--no-save)."""
    stored = getattr(getattr(links.record, "session", None), "id", None)
    return stored or getattr(links.session, "session_id", None) or PROBE_KEY


def request_body(model: str, convo, tools, params, room: int) -> dict:
    """The chat request; max_tokens cut to the room the prompt leaves (vLLM refuses a
    request whose prompt and max_tokens pass the window; the embedded engine cuts it)."""
    body = {"model": model, "messages": api_messages(convo), "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max(1, min(params.max_tokens, room)),
            "temperature": params.temperature}  # fmt: skip
    if params.top_p != 1.0:
        body["top_p"] = params.top_p
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.repetition_penalty != 1.0:  # vLLM's and SGLang's extra field (and ours)
        body["repetition_penalty"] = params.repetition_penalty
    if tools:
        body["tools"], body["tool_choice"] = tools, "auto"
    return body


def parsed_call(call):
    """A streamed call (chat_stream.StreamedCall) as the agent loop's ToolCallRecord: its
    arguments read as models write JSON, or an error saying they could not be."""
    from agentctx.lenient_json import json_error, load_json
    from agentctx.tool_calls import UNPARSED, ToolCallRecord

    text = call.arguments.strip() or "{}"
    try:
        args = load_json(text)
    except ValueError:
        return ToolCallRecord(call.name, {}, error=json_error(text), problem=UNPARSED)
    if not isinstance(args, dict):
        return ToolCallRecord(call.name, {}, error="the arguments are not a JSON object",
                              problem=UNPARSED)  # fmt: skip
    return ToolCallRecord(call.name, args)


def served_model(client: OpenAIClient, spec: BackendSpec) -> dict:
    """/v1/models' card of spec.model (or of the one model served, when none is named)."""
    cards = client.json(client.get("/models", PROBE_KEY)).get("data") or []
    cards = [c for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)]
    served = ", ".join(c["id"] for c in cards) or "none"
    where = f"the backend at {spec.name}"
    if spec.model is None:
        if len(cards) != 1:
            raise RemoteError(
                f"{where} serves {len(cards)} models ({served}): name one with --model"
            )
        return cards[0]
    card = next((c for c in cards if c["id"] == spec.model), None)
    if card is None:
        raise RemoteError(f"{where} serves no model {spec.model!r} (it serves: {served})")
    return card


def window_of(client: OpenAIClient, card: dict) -> int:
    """The window from /v1/models (vLLM's max_model_len, context_length), else llama-server's
    /props (n_ctx of its slots)."""
    for key in ("max_model_len", "context_length", "context_window"):
        if isinstance(card.get(key), int) and card[key] > 0:
            return card[key]
    response = client.get("/props", PROBE_KEY, root=True)
    if response.status_code == 200:
        props = client.json(response)
        n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx", props.get("n_ctx"))
        if isinstance(n_ctx, int) and n_ctx > 0:
            return n_ctx
    raise RemoteError(f"the backend does not say the window of {card['id']} (no max_model_len in "
                      '/v1/models): give it as "window" in a named backend of config.json')  # fmt: skip


def tool_format_of(spec: BackendSpec, counter: TokenCounter) -> str | None:
    """How the model takes tools: not at all when the config says so, or when the server's
    chat-aware /tokenize counts a prompt with tools as one without (the template ignores
    them); else the local template's format where it is known, else "hermes" (the server
    renders its own template; a server that refuses tools is found at the first turn)."""
    from agentctx.agent import tool_format

    if spec.tools is False:
        return None
    plain = [{"role": "user", "content": "Hello."}]
    ignored = lambda: counter.chat_count(plain, [PROBE_TOOL]) == counter.chat_count(plain)
    if counter.source == "server" and spec.tools is None and ignored():
        return None
    tokenizer = counter.tokenizer or (
        local_tokenizer(counter.model) if spec.tools is None else None
    )
    template = getattr(tokenizer, "chat_template", None)
    if template:
        return tool_format(template) or ("hermes" if spec.tools else None)
    return "hermes"


def connect_backend(ref: str, model: str | None, api_key_env: str | None) -> RemoteBackend:
    """The OpenAI-compatible server `--backend REF` names (a URL or a configured name),
    connected."""
    from agentctx.remote.backend_config import backend_spec

    return RemoteBackend.connect(backend_spec(ref, model, api_key_env))
