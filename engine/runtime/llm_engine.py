"""The public engine API: load a model, then generate, stream or chat.

    engine = Engine.load()                        # the default model, on the best device
    print(engine.chat([{"role": "user", "content": "Hi"}]).text)
    for event in engine.stream("Once upon a time", SamplingParams(max_tokens=20)):
        print(event.text, end="")

Requests share the continuous-batching loop of engine.runtime.engine_loop: every `step()`
runs one forward pass over all running sequences.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.errors import ContextTooLongError, EngineError
from engine.loading.devices import cpu_has_amx, pick_device, pick_dtype
from engine.loading.loader import (
    build_model,
    engine_model_config,
    init_dummy_weights,
    load_checkpoint_weights,
    load_tokenizer,
    resolve_source,
)
from engine.runtime.chat_ids import chat_template_ids
from engine.runtime.engine_loop import EngineLoop
from engine.runtime.requests import Completion, Stream
from engine.runtime.sequence import Sequence
from engine.sampling_params import SamplingParams

# Engine.load's weights modes
WEIGHT_MODES = ("auto", "dense", "int4", "int4-all")


class Engine(EngineLoop):
    """EngineLoop with a model loader, chat templates and the calls that run a request to
    its end (generate, chat) or stream it."""

    @classmethod
    def load(
        cls,
        model: str | Path | None = None,
        device: str | torch.device | None = "auto",
        dtype: str | torch.dtype | None = "auto",
        config: EngineConfig | None = None,
        seed: int = 0,
        weights: str = "auto",
    ) -> Engine:
        """model: None for the default model, a .gguf file, a checkpoint directory, a repo id
        in the local Hugging Face cache, or "dummy:PRESET" (random weights of a real shape).

        weights: "dense" runs the checkpoint's weights as they are (the exact reference).
        "int4" on a GPU runs every layer's linears as 4-bit groups through a Triton W4A16
        kernel (engine.loading.gpu_int4; random weights too, fitted on the GPU). "int4", on
        the CPU, decodes through the GGUF's own 4-bit blocks (Q4_0, Q4_1, Q4_K),
        per-row int8 requantizations of its 5- to 8-bit ones (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0)
        and an int8 output head, and prefills with dense weights (bf16 where the CPU has AMX):
        fast and close to, not identical with, the reference. "int4-all" is int4 with the
        5- to 8-bit types requantized to 4-bit groups instead of int8 rows: fewer bytes per
        token, less precise (engine.loading.int4_groups). "auto" picks int4 where the
        checkpoint has such weights and the device is the CPU, else dense."""
        fast = False
        if weights not in WEIGHT_MODES:
            raise EngineError(f"unknown weights mode {weights!r}; use {', '.join(WEIGHT_MODES)}")
        dev = pick_device(device)
        dt = pick_dtype(dtype, dev)
        source = resolve_source(model, config.cache_dir if config is not None else None)
        cfg = engine_model_config(source, config)
        net = build_model(cfg, dev, dt)
        if source.kind == "dummy":
            init_dummy_weights(net, seed)
        else:
            load_checkpoint_weights(net, source.path)
        if dev.type == "cuda" and weights.startswith("int4"):
            from engine.loading.gpu_int4 import load_gpu_int4  # 4-bit groups, W4A16 kernel

            directory = None if source.kind == "dummy" else source.path
            fast = load_gpu_int4(net, directory) > 0
        elif weights != "dense" and source.kind != "dummy":
            from engine.loading.quant import load_int4  # (CPU decode only: loaded when used)

            fast = load_int4(net, source, dev, required=weights.startswith("int4"),
                             all_int4=weights == "int4-all")  # fmt: skip
        tokenizer = load_tokenizer(source)
        engine = cls(net, cfg, tokenizer, config, dev, dt, name=source.name)
        engine.weights_mode = ("int4-all" if weights == "int4-all" else "int4") if fast else "dense"
        if fast and cpu_has_amx():
            # the int4 mode is approximate already; its prefill attention runs in bf16 (AMX)
            engine.runner.prefill_attn_dtype = torch.bfloat16
        return engine

    # -- tokens ----------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def chat_tokens(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> list[int]:
        """The chat template's tokens; `tools` (JSON schemas) for templates that take them.
        A message with "token_ids" (an answer's generated ids) keeps exactly those ids in
        place of its re-tokenized content (engine.runtime.chat_ids)."""
        return chat_template_ids(self.tokenizer, messages, add_generation_prompt, tools)

    # -- convenience -----------------------------------------------------------------------

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None) -> Stream:
        return Stream(self, self.add_request(prompt, params))

    def chat_stream(self, messages: list[dict], params: SamplingParams | None = None) -> Stream:
        return self.stream(self.chat_tokens(messages), params)

    def generate(
        self,
        prompts: list[str | list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[Completion]:
        plist = params if isinstance(params, list) else [params] * len(prompts)
        reqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        while not all(r.done for r in reqs):
            self.step()
        return [
            Completion(r.text, r.seq.completion_token_ids, r.seq.finish_reason or "", r.stats)
            for r in reqs
        ]

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> Completion:
        return self.generate([self.chat_tokens(messages)], params)[0]


def prompt_logits(engine: Engine, token_ids: list[int]) -> torch.Tensor:
    """Logits [T, V] for every position of one prompt, in one forward over the paged cache.

    For correctness checks and perplexity; it borrows pages (bypassing the prefix cache, so
    every position is computed) and returns them."""
    from engine.runtime.scheduler import ScheduledSeq, SchedulerOutput

    if len(token_ids) > engine.max_model_len:  # (this pass samples nothing: == fits)
        note = engine.model_config.window_note
        raise ContextTooLongError(len(token_ids), engine.max_model_len, note=note)
    seq = Sequence(list(token_ids), SamplingParams(max_tokens=1))
    bm, runner = engine.block_manager, engine.runner
    with engine._lock:
        caching, bm.prefix.enabled = bm.prefix.enabled, False
        try:
            if not bm.can_allocate(seq):
                raise EngineError("the KV cache has no room for this prompt")
            bm.allocate(seq)
        finally:
            bm.prefix.enabled = caching
        try:
            out = SchedulerOutput([ScheduledSeq(seq, len(seq), True)], [])
            with torch.inference_mode():
                hidden = runner.eager_hidden(runner.prepare(out))
                return engine.model.compute_logits(hidden).float()
        finally:
            bm.free(seq)
