"""The HTTP side of a remote backend: OpenAI's API over httpx, each request sent to the
session's replica (routing.py), with a connection error moving to the next one. Every
failure becomes one RemoteError whose message says which server and what went wrong: down,
a refused key, a 4xx with the server's own message."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx

from agentctx.remote.backend_config import BackendSpec
from agentctx.remote.chat_stream import StreamError, sse_data
from agentctx.remote.routing import Replicas
from engine.errors import EngineError

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0  # a long prompt's prefill comes before its first byte


class RemoteError(EngineError):
    """The backend could not be reached, or refused or failed the request (`status`: the
    HTTP status it answered with, if any)."""

    def __init__(self, message: str, status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.status, self.detail = status, detail  # detail: the server's own message


def api_urls(url: str) -> tuple[str, str]:
    """(the API's base, ending in /v1; the server's root, where /tokenize and /health are)."""
    url = url.rstrip("/")
    if url.endswith("/v1"):
        return url, url[: -len("/v1")]
    return url + "/v1", url


class OpenAIClient:
    """OpenAI's API on a backend's replicas; `key`, the routing key, is the session id."""

    def __init__(self, spec: BackendSpec, timeout: float = READ_TIMEOUT_S) -> None:
        self.spec = spec
        self.replicas = Replicas(spec.urls)
        key = spec.api_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(
            headers=headers, timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S)
        )
        self.timeout = timeout

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, key: str, root: bool = False) -> httpx.Response:
        return self._send("GET", path, key, root)

    def post(self, path: str, body: dict, key: str, root: bool = False) -> httpx.Response:
        return self._send("POST", path, key, root, body)

    def json(self, response: httpx.Response) -> dict:
        """The body of a response that succeeded; else the RemoteError it means."""
        if response.status_code >= 400:
            raise self.status_error(response)
        try:
            body = response.json()
        except ValueError:
            raise RemoteError(f"{self._where(response)} answered with a body that is not JSON: "
                              f"{response.text[:200]!r}") from None  # fmt: skip
        if not isinstance(body, dict):
            raise RemoteError(f"{self._where(response)} answered with JSON that is not an object")
        return body

    @contextlib.contextmanager
    def stream_chat(self, body: dict, key: str) -> Iterator[Iterator[dict]]:
        """POST /v1/chat/completions with stream: the chunks as they arrive."""
        for base in self._order(key):
            url = api_urls(base)[0] + "/chat/completions"
            try:
                with self.http.stream("POST", url, json=body) as response:
                    self.replicas.answered(base)
                    if response.status_code >= 400:
                        response.read()
                        raise self.status_error(response)
                    yield self._chunks(response)
                    return
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                self._down(base, e)
            except httpx.TimeoutException:
                raise RemoteError(
                    f"the backend at {base} sent nothing for {self.timeout:.0f} s"
                ) from None
            except httpx.HTTPError as e:  # the connection dropped mid-answer
                raise RemoteError(
                    f"the backend at {base} failed mid-answer: {_reason(e)}"
                ) from None
        raise self._unreachable()

    def _chunks(self, response: httpx.Response) -> Iterator[dict]:
        try:
            yield from sse_data(response.iter_lines())
        except StreamError as e:
            raise RemoteError(f"{self._where(response)}: {e}") from None

    def _send(self, method: str, path: str, key: str, root: bool, body=None) -> httpx.Response:
        for base in self._order(key):
            url = (api_urls(base)[1] if root else api_urls(base)[0]) + path
            try:
                response = self.http.request(method, url, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                self._down(base, e)
                continue
            except httpx.TimeoutException:
                raise RemoteError(f"the backend at {base} did not answer within "
                                  f"{self.timeout:.0f} s") from None  # fmt: skip
            except httpx.HTTPError as e:
                raise RemoteError(f"the backend at {base} failed: {_reason(e)}") from None
            self.replicas.answered(base)
            return response
        raise self._unreachable()

    def _order(self, key: str) -> list[str]:
        self._reasons: dict[str, str] = {}
        return self.replicas.candidates(key)

    def _down(self, base: str, e: Exception) -> None:
        self.replicas.failed(base)
        self._reasons[base] = _reason(e)

    def _unreachable(self) -> RemoteError:
        tried = "; ".join(f"{url} ({why})" for url, why in self._reasons.items())
        return RemoteError(f"cannot reach the backend: {tried}")

    def status_error(self, response: httpx.Response) -> RemoteError:
        status, where = response.status_code, self._where(response)
        message = error_message(response)
        if status in (401, 403):
            hint = (f"check the key in ${self.spec.api_key_env}" if self.spec.api_key_env
                    else "give its key with --api-key-env VAR")  # fmt: skip
            return RemoteError(f"{where} refused the request ({status}: {message}); {hint}", status,
                               message)  # fmt: skip
        if status == 404 and "/chat/completions" in str(response.request.url):
            return RemoteError(f"{where} has no {response.request.url.path} ({message}): "
                               "--backend takes the API's base URL, such as http://HOST:PORT/v1",
                               status, message)  # fmt: skip
        return RemoteError(f"{where} answered {status}: {message}", status, message)

    def _where(self, response: httpx.Response) -> str:
        url = response.request.url
        return f"the backend at {url.scheme}://{url.netloc.decode()}"


def error_message(response: httpx.Response) -> str:
    """The server's own words: OpenAI's {"error": {"message"}}, FastAPI's {"detail"}, or the
    body's start."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300] or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("message"):
            return str(body["message"])
        if body.get("detail"):
            return str(body["detail"])
    return str(body)[:300]


def _reason(e: Exception) -> str:
    """httpx's error in a few words: connection refused, not its chain of causes."""
    text = str(e) or type(e).__name__
    if "refused" in text.lower():
        return "connection refused"
    return text.split("] ")[-1][:200]
