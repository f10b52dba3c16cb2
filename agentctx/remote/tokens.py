"""Token counts for packing against a remote model: the server's /tokenize where it has
one (vLLM and agentctx serve: {"model", "prompt"} or {"model", "messages", "tools"}, giving
"count"; llama.cpp's llama-server: {"content"}, giving "tokens"), else the model's own
tokenizer when it is on this machine, else about 4 characters a token. The last two are
estimates, and `estimate` says so (the packing report shows it)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

from agentctx.remote.client import OpenAIClient, RemoteError

CHARS_PER_TOKEN = 4  # English text and code, for a BPE vocabulary of 32K-150K
MESSAGE_OVERHEAD = 8  # role markers and separators around each message, estimated


class TokenCounter:
    """`source`: "server" (chat-aware /tokenize), "llama.cpp" (/tokenize of text),
    "tokenizer" (local) or "characters"."""

    def __init__(self, client: OpenAIClient | None, model: str, key: str, source: str,
                 tokenizer=None) -> None:  # fmt: skip
        self.client, self.model, self.key, self.source = client, model, key, source
        self.tokenizer = tokenizer
        self._counts: dict[str, int] = {}

    @classmethod
    def for_backend(cls, client: OpenAIClient, model: str, key: str) -> TokenCounter:
        """The best counter the server and this machine allow."""
        probe = "Hello, world."
        response = client.post("/tokenize", {"model": model, "prompt": probe,
                                             "add_special_tokens": False}, key, root=True)  # fmt: skip
        if response.status_code in (401, 403):
            raise client.status_error(response)
        if response.status_code == 200 and isinstance(_body(response).get("count"), int):
            return cls(client, model, key, "server")
        response = client.post("/tokenize", {"content": probe}, key, root=True)
        if response.status_code == 200 and isinstance(_body(response).get("tokens"), list):
            return cls(client, model, key, "llama.cpp")
        tokenizer = local_tokenizer(model)
        return cls(None, model, key, "tokenizer" if tokenizer else "characters", tokenizer)

    @property
    def estimate(self) -> bool:
        return self.source in ("tokenizer", "characters")

    def describe(self) -> str:
        return {
            "server": "the server's /tokenize",
            "llama.cpp": "the server's /tokenize (chat markup estimated)",
            "tokenizer": f"an estimate: {self.model}'s tokenizer on this machine (the server has "
            "no /tokenize)",
            "characters": f"an estimate: ~{CHARS_PER_TOKEN} characters a token (the server has "
            "no /tokenize and the model's tokenizer is not on this machine)",
        }[self.source]

    def count(self, text: str) -> int:
        if text not in self._counts:
            self._counts[text] = self._count(text)
        return self._counts[text]

    def _count(self, text: str) -> int:
        if not text:
            return 0
        if self.source == "server":
            body = {"model": self.model, "prompt": text, "add_special_tokens": False}
            return self._ask(body)["count"]
        if self.source == "llama.cpp":
            return len(self._ask({"content": text, "add_special": False})["tokens"])
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text, add_special_tokens=False))
        return math.ceil(len(text) / CHARS_PER_TOKEN)

    def chat_count(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        """The prompt's tokens: the messages in the chat template, with the generation
        prompt (and the tools' schemas)."""
        from agentctx.remote.messages import api_messages

        messages = api_messages(messages)
        if self.source == "server":
            body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
            if tools:
                body["tools"] = tools
            return self._ask(body)["count"]
        if self.source == "tokenizer" and getattr(self.tokenizer, "chat_template", None):
            extra = {"tools": tools} if tools else {}
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                     tokenize=True, **extra)  # fmt: skip
            return len(ids["input_ids"] if hasattr(ids, "keys") else ids)
        texts = [str(m.get("content") or "") + json.dumps(m.get("tool_calls") or "")
                 for m in messages]  # fmt: skip
        markup = MESSAGE_OVERHEAD * (len(messages) + 1)
        return sum(self.count(t) for t in texts) + markup + self.count(json.dumps(tools or ""))

    def _ask(self, body: dict) -> dict:
        return self.client.json(self.client.post("/tokenize", body, self.key, root=True))


def _body(response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def local_tokenizer(model: str):
    """The tokenizer of `model` when it is on this machine (a checkpoint directory, or a
    Hugging Face repo id in the local cache); None otherwise."""
    from agentctx.models import resolve_model

    try:
        name = resolve_model(model)
    except Exception:  # a bad config file: no local tokenizer, the estimate goes on
        return None
    name = name.removeprefix("dummy:")
    path = Path(name).expanduser()
    if path.is_file() or (not path.is_dir() and name.count("/") != 1):
        return None  # a .gguf file, a known name: its tokenizer is not at hand without loading
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path) if path.is_dir() else name,
                                             local_files_only=True)  # fmt: skip
    except Exception:  # not cached, not a tokenizer: the character estimate
        return None


class PackingModel:
    """What agentctx.ask's packing reads of an engine (count_tokens, chat_tokens,
    max_model_len and the chat template's say on tools), over a remote backend's counter."""

    def __init__(self, counter: TokenCounter, window: int, template: str | None) -> None:
        self.counter, self.max_model_len = counter, window
        self.tokenizer = SimpleNamespace(chat_template=template)

    def count_tokens(self, text: str) -> int:
        return self.counter.count(text)

    def chat_tokens(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:  # fmt: skip
        return [0] * self.counter.chat_count(messages, tools)  # (its length is what counts)


__all__ = ["PackingModel", "RemoteError", "TokenCounter", "local_tokenizer"]
