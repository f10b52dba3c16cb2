"""`ask --dry-run`: the turn packed as it would be, its packing report and prompt size, and
nothing else: no model weights loaded (the embedded backend counts with the model's
tokenizer alone, engine.runtime.prompt_tokens), nothing generated, nothing stored."""

from __future__ import annotations


def tokenizer_backend(model: str, config):
    """An EmbeddedBackend over the model's tokenizer and window only: it packs and counts,
    and cannot answer."""
    from agentctx.backend import EmbeddedBackend
    from engine.runtime.prompt_tokens import PromptTokens

    return EmbeddedBackend(PromptTokens.load(model, config))


def report(backend, turn, output) -> None:
    """The prompt's size against the window, as the last info line."""
    from agentctx.agent import engine_tool_format
    from agentctx.backend import EmbeddedBackend
    from tools.registry import BOOK_TOOLS, REPO_TOOLS, schemas

    window = backend.window
    if isinstance(backend, EmbeddedBackend):
        view = backend.engine
        tools = None
        if engine_tool_format(view) is not None:
            tools = schemas(BOOK_TOOLS if turn.kind == "book" else REPO_TOOLS)
        prompt = len(view.chat_tokens(turn.messages, tools=tools))
        size = f"{prompt:,} prompt tokens of the {window:,}-token window ({window - prompt:,} left)"
    else:  # a server counts its own prompt; the packing line above has its context's count
        size = f"the server's window is {window:,} tokens"
    output.info(f"dry run: {size}; nothing was generated or stored")
