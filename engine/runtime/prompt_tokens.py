"""A model's tokenizer and window without its weights: what packing needs to count a
prompt (chat template, tool schemas, window) when nothing is generated (`ask --dry-run`).
The same counts as the Engine's: both render through engine.runtime.chat_ids."""

from __future__ import annotations

from engine.config import EngineConfig
from engine.errors import ModelLoadError
from engine.runtime.chat_ids import chat_template_ids


class PromptTokens:
    def __init__(self, tokenizer, max_model_len: int, name: str = "", vocab_size: int = 0) -> None:
        self.tokenizer, self.max_model_len, self.name = tokenizer, max_model_len, name
        self.vocab_size = vocab_size  # (0: not known)

    @classmethod
    def load(cls, model: str | None, config: EngineConfig | None = None) -> PromptTokens:
        """The tokenizer and window of `model` (what Engine.load takes; a GGUF is converted
        into the cache once, as for Engine.load, but no weights are loaded)."""
        from engine.loading.loader import engine_model_config, load_tokenizer, resolve_source

        config = config or EngineConfig()
        source = resolve_source(model, config.cache_dir)
        tokenizer = load_tokenizer(source)
        if tokenizer is None:
            raise ModelLoadError(f"{source.name} has no tokenizer: nothing to count prompts with")
        model_config = engine_model_config(source, config)
        window = model_config.context_window
        return cls(tokenizer, min(config.max_model_len or window, window), source.name,
                   model_config.vocab_size)  # fmt: skip

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def chat_tokens(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:  # fmt: skip
        return chat_template_ids(self.tokenizer, messages, add_generation_prompt, tools)
