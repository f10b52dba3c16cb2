"""POST /v1/chat/completions and /v1/completions: a checked request becomes an engine
request; its events become one response object, or server-sent events (data: {chunk}, then
data: [DONE]). Tool calls are parsed with the agent loop's own parsers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.responses import JSONResponse, StreamingResponse

from agentctx.agent import VisibleText, parse_tool_calls, tool_format
from agentctx.serve import openai_schema as oa
from agentctx.serve.openai_schema import ApiError
from agentctx.serve.runner import EngineRunner, RequestHandle


class EventStream(StreamingResponse):
    """Server-sent events whose request is cancelled however the response ends: finished,
    the client gone mid-stream, or the server shutting down."""

    def __init__(self, content: AsyncIterator[str], on_close) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})  # fmt: skip
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


async def pieces(handle: RequestHandle, fmt: str | None, names: list[str], ids: bool = False):
    """("content", text) as it may be shown, then ("calls", calls) and ("done", event).
    With a tool format, text that may start a call is held back until it is decided. With
    ids, ("ids", token ids) after their text. The tokens that arrived together (the loop
    fell behind the engine) come as one piece: one chunk to send, not one per token."""
    visible = VisibleText(fmt, names) if fmt else None
    text, done = "", None
    async for events in handle.events():  # (the events that arrived together: one piece)
        new, new_ids = "", []
        for event in events:
            if event.kind == "done":
                done = event
                continue
            new += event.text or ""
            if ids and event.token_ids:
                new_ids += event.token_ids
        if new:
            text += new
            shown = visible.feed(new) if visible else new
            if shown:
                yield "content", shown
        if new_ids:
            yield "ids", new_ids
    if done.finish_reason and done.finish_reason.startswith("error"):
        raise ApiError(500, f"the engine failed: {done.finish_reason}", kind="server_error")
    content, calls = parse_tool_calls(text, fmt, names) if fmt else (text, [])
    calls = [c for c in calls if c.name]
    rest = visible.end(content) if visible else ""
    if rest:
        yield "content", rest
    yield "calls", oa.tool_calls_out(calls)
    yield "done", done


class Completions:
    """The two completion endpoints over one runner."""

    def __init__(self, runner: EngineRunner, model_name: str) -> None:
        self.runner, self.engine, self.model = runner, runner.loaded(), model_name
        self.window = self.engine.max_model_len

    async def chat(self, body) -> JSONResponse | EventStream:
        req = oa.parse_chat(body, self.window)
        if self.engine.tokenizer is None:
            raise ApiError(400, "this model has no tokenizer or chat template: use "
                           "/v1/completions with token ids", "messages")  # fmt: skip
        fmt = None
        if req.tools:
            fmt = tool_format(getattr(self.engine.tokenizer, "chat_template", None))
            if fmt is None:
                raise ApiError(400, "this model's chat template takes no tools", "tools")
        try:
            ids = self.engine.chat_tokens(req.messages, tools=req.tools)
        except Exception as e:  # jinja's errors, and the template's own raise_exception
            raise ApiError(400, f"the chat template cannot render these messages: {e}",
                           "messages") from None  # fmt: skip
        handle = await self._submit(ids, req.params)
        rid = oa.new_id("chatcmpl")
        if req.stream:
            stream = self._chat_stream(handle, req, rid, fmt)
            return EventStream(stream, lambda: self.runner.cancel(handle))
        try:
            content, calls, done = "", [], None
            async for kind, value in pieces(handle, fmt, req.tool_names):
                if kind == "content":
                    content += value
                elif kind == "calls":
                    calls = value
                else:
                    done = value
        finally:
            self.runner.cancel(handle)
        finish = oa.finish_reason(done.finish_reason, bool(calls))
        body = oa.chat_completion(rid, self.model, content if content or not calls else None,
                                  calls, finish, done.stats)  # fmt: skip
        return JSONResponse(body)

    async def _chat_stream(self, handle, req, rid: str, fmt) -> AsyncIterator[str]:
        chunk = lambda delta, finish=None: sse(oa.chat_chunk(rid, self.model, delta, finish))
        yield chunk({"role": "assistant", "content": ""})
        calls = []
        try:
            async for kind, value in pieces(handle, fmt, req.tool_names):
                if kind == "content":
                    yield chunk({"content": value})
                elif kind == "calls" and value:
                    calls = value
                    yield chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
                elif kind == "done":
                    yield chunk({}, oa.finish_reason(value.finish_reason, bool(calls)))
                    if req.include_usage:
                        yield sse(oa.chat_chunk(rid, self.model, None, stats=value.stats))
        except ApiError as e:  # the status line has gone: the error is an event
            yield sse(e.body())
        yield sse("[DONE]")

    async def text(self, body) -> JSONResponse | EventStream:
        req = oa.parse_completion(body, self.window)
        # a model without a tokenizer answers in token ids only
        req.return_token_ids = req.return_token_ids or self.engine.tokenizer is None
        handle = await self._submit(self._prompt_ids(req.prompt), req.params)
        rid = oa.new_id("cmpl")
        if req.stream:
            stream = self._text_stream(handle, req, rid)
            return EventStream(stream, lambda: self.runner.cancel(handle))
        try:
            text, ids, done = "", [], None
            async for kind, value in pieces(handle, None, [], req.return_token_ids):
                if kind == "content":
                    text += value
                elif kind == "ids":
                    ids += value
                elif kind == "done":
                    done = value
        finally:
            self.runner.cancel(handle)
        finish = oa.finish_reason(done.finish_reason, False)
        return JSONResponse(
            oa.text_completion(
                rid, self.model, text, finish, done.stats, ids if req.return_token_ids else None
            )
        )

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            vocab = self.engine.vocab_size
            if max(prompt) >= vocab:
                raise ApiError(400, f"'prompt' has token id {max(prompt)}; the vocabulary has "
                               f"{vocab}", "prompt")  # fmt: skip
            return prompt
        if self.engine.tokenizer is None:
            raise ApiError(400, "this model has no tokenizer: send 'prompt' as token ids",
                           "prompt")  # fmt: skip
        return self.engine.encode(prompt)

    async def _text_stream(self, handle, req, rid: str) -> AsyncIterator[str]:
        text = ""  # with token ids, a chunk per token: its text and its ids
        try:
            async for kind, value in pieces(handle, None, [], req.return_token_ids):
                if kind == "content" and req.return_token_ids:
                    text += value
                elif kind == "content":
                    yield sse(oa.text_completion(rid, self.model, value, None))
                elif kind == "ids":
                    yield sse(oa.text_completion(rid, self.model, text, None, token_ids=value))
                    text = ""
                elif kind == "done":
                    finish = oa.finish_reason(value.finish_reason, False)
                    yield sse(oa.text_completion(rid, self.model, text, finish))
                    if req.include_usage:
                        yield sse(oa.text_completion(rid, self.model, None, None, value.stats))
        except ApiError as e:
            yield sse(e.body())
        yield sse("[DONE]")

    async def _submit(self, ids: list[int], params) -> RequestHandle:
        from engine import ContextTooLongError, EngineError

        if not self.runner.admitting:
            raise ApiError(503, "the server is shutting down", kind="server_error")
        if len(ids) >= self.window:
            raise ApiError(400, f"the prompt is {len(ids)} tokens; the model's window is "
                           f"{self.window}", "messages", "context_length_exceeded")  # fmt: skip
        try:
            return await self.runner.submit(ids, params)
        except ContextTooLongError as e:
            raise ApiError(400, str(e), "messages", "context_length_exceeded") from None
        except EngineError as e:  # a cache too small for this request
            raise ApiError(400, str(e), "max_tokens") from None
