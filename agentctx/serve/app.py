"""The Starlette app of `agentctx serve`: OpenAI's routes over one engine, errors in
OpenAI's JSON shape, a cap on the request body and, with an API key, bearer auth."""

from __future__ import annotations

import contextlib
import hmac
import json
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentctx.serve.completions import Completions
from agentctx.serve.openai_schema import ApiError
from agentctx.serve.runner import EngineRunner
from agentctx.serve.tokenize import tokenize

MAX_BODY_BYTES = 8 << 20  # a whole window of text is well under 1 MiB
SHUTDOWN_TIMEOUT_S = 10.0


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


class BearerAuth:
    """ASGI middleware: every HTTP request needs `Authorization: Bearer <key>`."""

    def __init__(self, app, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.key):
                e = ApiError(401, "a valid API key is required (Authorization: Bearer KEY)",
                             code="invalid_api_key", kind="authentication_error")  # fmt: skip
                await error_response(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def read_json(request: Request, limit: int):
    """The request's JSON body; over `limit` bytes, a 413 before all of it is read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    try:
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise _too_large(limit)
    except ClientDisconnect:
        raise ApiError(400, "the client disconnected while sending the body") from None
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:  # (UnicodeDecodeError is a ValueError)
        raise ApiError(400, f"the body is not valid JSON: {e}") from None


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is over {limit:,} bytes", code="request_too_large")


def create_app(runner: EngineRunner, model_name: str, api_key: str | None = None,
               max_body: int = MAX_BODY_BYTES,
               shutdown_timeout: float = SHUTDOWN_TIMEOUT_S) -> Starlette:  # fmt: skip
    """The app over a started runner whose engine has loaded; the runner is drained when the
    app shuts down (its lifespan)."""
    engine = runner.loaded()  # (its tokenizer and window: the weights are in its process)
    completions = Completions(runner, model_name)
    created = int(time.time())

    async def chat(request: Request):
        return await completions.chat(await read_json(request, max_body))

    async def text(request: Request):
        return await completions.text(await read_json(request, max_body))

    async def count(request: Request):
        return JSONResponse(tokenize(engine, await read_json(request, max_body)))

    async def models(request: Request):
        window = engine.max_model_len
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "agentctx",
                "context_length": window, "max_model_len": window}  # fmt: skip
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request):
        # the engine's counters as of its last step (engine_process.EngineCore.counters)
        return JSONResponse({"status": "ok" if runner.admitting else "shutting_down",
                             "model": model_name, "requests": runner.active,
                             **runner.counters})  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await runner.drain(shutdown_timeout)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", text, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/tokenize", count, methods=["POST"]),
    ]
    middleware = [Middleware(BearerAuth, key=api_key)] if api_key else []
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                                        Exception: _server_error})  # fmt: skip
    app.state.runner = runner
    return app


async def _api_error(request: Request, e: ApiError) -> JSONResponse:
    return error_response(e)


async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
    kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
    return error_response(ApiError(e.status_code, str(e.detail), kind=kind))


async def _server_error(request: Request, e: Exception) -> JSONResponse:
    return error_response(ApiError(500, f"internal error: {type(e).__name__}: {e}",
                                   kind="server_error"))  # fmt: skip
