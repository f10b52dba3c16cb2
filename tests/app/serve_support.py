"""What tests/app/test_serve.py runs `agentctx serve` over: a real server process on a free
port of 127.0.0.1, and a model whose weights play a script.

No small model that runs offline calls tools, so the tool-calling model's weights are a
bigram table: its layers add nothing to the residual (their output projections are zero),
so each next token follows from the last one alone, embedding (one-hot) -> final norm ->
lm_head row. Two chains are written in: after the generation prompt, a Hermes tool call;
after a tool result, an answer. Everything else in the server is real: the engine runs the
checkpoint, the template renders the tools, and the agent loop's parser reads the call."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from tests.app.tool_templates import HERMES
from tests.reliability.tiny_chat_model import TINY

# the call is written in a form whose tokens are all distinct under SmolLM2's tokenizer (a
# bigram table cannot repeat a token); the agent loop's parser repairs the quoting
TOOL_CALL = "<tool_call>{\"name\": \"weather\",'city':'Paris'}"
TOOL_RESULT = "22C and clear"
ANSWER = "It is sunny."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },  # fmt: skip
    },
}
# HERMES, except that a prompt ending with a tool result ends with that result's text (no
# generation prompt after it), so the bigram table can answer from it
TOOL_TEMPLATE = HERMES.replace(
    "{{ m.content }}\n</tool_response><|im_end|>\n", "{{ m.content }}"
).replace(
    "{%- if add_generation_prompt %}",
    "{%- if add_generation_prompt and messages[-1].role != 'tool' %}",
)


@contextlib.contextmanager
def refusing_port(first_for: str | None = None, beside: str = ""):
    """A port on 127.0.0.1 that refuses connections while the block runs: bound and not
    listening, so no other socket takes it meanwhile. With `first_for` (a routing key), one
    whose URL http://127.0.0.1:PORT/v1 the replicas [it, beside] try first for that key."""
    from agentctx.remote.routing import Replicas

    with contextlib.ExitStack() as held:
        for _ in range(64):
            s = held.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            url = f"http://127.0.0.1:{port}/v1"
            if first_for is None or Replicas([url, beside]).order(first_for)[0] == url:
                yield port
                return
        raise AssertionError("no port ranks first for the key in 64 tries")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m agentctx serve ARGS` on a free port; `url` once it says it listens."""

    def __init__(self, model: str, *args: str, env: dict | None = None) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "agentctx", "serve", "--model", model,
                "--port", str(self.port), *args]  # fmt: skip
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        self.log: list[str] = []  # stderr after the banner
        self.banner = self._wait_for_banner(timeout=120)

    def _wait_for_banner(self, timeout: float) -> str:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sel.select(timeout=1):
                line = self.proc.stderr.readline()
                if not line:
                    break
                if "agentctx serve:" in line and "http://" in line:
                    threading.Thread(target=self._drain, daemon=True).start()
                    return line.strip()
            if self.proc.poll() is not None:
                break
        self.stop()
        raise AssertionError(f"the server did not start: {self.proc.stderr.read()}")

    def _drain(self) -> None:
        """Keep reading stderr, so that a full pipe never blocks the server."""
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def scripted_tool_model(directory: Path, tokenizer_dir: Path) -> tuple[str, list[int]]:
    """A checkpoint (its directory) that writes TOOL_CALL after the generation prompt and
    ANSWER after TOOL_RESULT, and the chain's tokens (for the test to check the table)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, directory / name)
    config_path = directory / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config["chat_template"] = TOOL_TEMPLATE
    config_path.write_text(json.dumps(tok_config))
    tok = AutoTokenizer.from_pretrained(directory)
    encode = lambda text: tok.encode(text, add_special_tokens=False)
    eos = tok.eos_token_id
    call_chain = [encode("<|im_start|>assistant\n")[-1], *encode(TOOL_CALL), eos]
    answer_chain = [encode("<tool_response>\n" + TOOL_RESULT)[-1], *encode(ANSWER), eos]
    pairs = lambda chain: list(zip(chain, chain[1:], strict=False))
    table = pairs(call_chain) + pairs(answer_chain)
    sources = [a for a, _ in table]
    assert len(set(sources)) == len(sources), "a bigram table maps each token once"
    hidden = TINY["hidden_size"]
    assert len(sources) <= hidden
    cfg = LlamaConfig(**{**TINY, "tie_word_embeddings": False, "eos_token_id": eos})
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
        for i, (a, b) in enumerate(table):
            model.model.embed_tokens.weight[a, i] = 1.0
            model.lm_head.weight[b, i] = 1.0
    model.save_pretrained(directory)
    return str(directory), call_chain
