"""The public engine API: load a model, then generate, stream or chat.

    engine = Engine.load()                        # the default model, on the best device
    print(engine.chat([{"role": "user", "content": "Hi"}]).text)
    for event in engine.stream("Once upon a time", SamplingParams(max_tokens=20)):
        print(event.text, end="")

Requests share the continuous-batching loop: every `step()` runs one forward pass over all
running sequences. A stream drives `step()` from the thread that iterates it and can be
cancelled from any other thread; the tokens produced so far are kept.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig, ModelConfig
from engine.detokenizer import Detokenizer
from engine.errors import CacheFullError, ContextTooLongError, EngineError, ModelLoadError
from engine.loading.loader import (
    build_model,
    init_dummy_weights,
    load_checkpoint_weights,
    load_tokenizer,
    read_config,
    resolve_source,
)
from engine.model_runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence

if TYPE_CHECKING:
    from engine.session import EngineSession


@dataclass(slots=True)
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache
    completion_tokens: int = 0
    ttft_s: float = 0.0  # request start to first sampled token
    total_s: float = 0.0
    # speculative decoding (engine.spec.decoder.SpecStats): verification steps, drafted and
    # accepted tokens, proposer time; None when no step of the request speculated
    speculation: object | None = None

    @property
    def prefill_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def decode_tok_s(self) -> float:
        decode_s = self.total_s - self.ttft_s
        return (
            (self.completion_tokens - 1) / decode_s
            if self.completion_tokens > 1 and decode_s > 0
            else 0.0
        )

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.ttft_s if self.ttft_s > 0 else 0.0


@dataclass(slots=True)
class StreamEvent:
    kind: str  # "prefill" (progress), "token" (new text), "done"
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens in the cache so far
    prompt_tokens: int = 0
    finish_reason: str | None = None
    stats: GenerationStats | None = None


@dataclass(slots=True)
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: GenerationStats


class Request:
    def __init__(self, seq: Sequence, detok: Detokenizer | None):
        self.seq, self.detok = seq, detok
        self.events: deque[StreamEvent] = deque()
        self.cancelled = threading.Event()
        self.start = time.perf_counter()
        self.stats = GenerationStats(prompt_tokens=seq.num_prompt_tokens)
        self.session: EngineSession | None = None

    @property
    def done(self) -> bool:
        return self.seq.is_finished

    @property
    def text(self) -> str:
        return self.detok.text if self.detok else ""


class Stream:
    """Iterator over a request's events; `cancel()` is safe from another thread."""

    def __init__(self, engine: Engine, request: Request):
        self.engine, self.request = engine, request

    def __iter__(self) -> Iterator[StreamEvent]:
        req = self.request
        while True:
            while req.events:
                event = req.events.popleft()
                yield event
                if event.kind == "done":
                    return
            self.engine.step()

    def cancel(self) -> None:
        self.request.cancelled.set()

    @property
    def token_ids(self) -> list[int]:
        return self.request.seq.completion_token_ids

    @property
    def text(self) -> str:
        return self.request.text


def _load_int4(net, source, device: torch.device, required: bool) -> bool:
    """Switch a CPU model to the GGUF's quantized linears for decode (engine.loading.quant: 4-bit
    blocks, or int8 rows for 5- to 8-bit types) and an int8 output head. Returns whether it
    did; `required` turns "no quantized weights here" into an error."""
    if device.type != "cpu":
        if required:
            raise EngineError("int4 weights run on the CPU only")
        return False
    from engine.loading.gguf_quants import INT4_TYPES, INT8_TYPES
    from engine.loading.quant import load_quantized, quantize_lm_head

    # prefill chunks run dense: in bf16 where the CPU has AMX (3.5x faster than fp32 at 512
    # tokens on this machine's Xeon), else in the checkpoint's fp32
    dense = torch.bfloat16 if _cpu_has_amx() else torch.float32
    if load_quantized(net, source.path, dense) == 0:
        if required:
            types = ", ".join(INT4_TYPES + INT8_TYPES)
            raise EngineError(
                f"{source.name} has no quantized weights (int4 needs a GGUF whose linear "
                f"weights are all {types})"
            )
        return False
    quantize_lm_head(net, source.path)
    return True


def _cpu_has_amx() -> bool:
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def _pick_device(device: str | torch.device | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelLoadError(f"unknown device {device!r} (use cpu, cuda, cuda:N or auto)") from e
    if dev.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"device {device!r} is not supported (use cpu, cuda, cuda:N or auto)")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch has no CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise ModelLoadError(f"device {device!r}: {why}; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {device!r}: there are {torch.cuda.device_count()} GPUs")
    return dev


def _pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}  # fmt: skip
        if dtype not in names:
            raise EngineError(f"unknown dtype {dtype!r}; use one of {', '.join(names)}")
        return names[dtype]
    return dtype


class Engine:
    def __init__(
        self,
        model,
        model_config: ModelConfig,
        tokenizer,
        config: EngineConfig | None = None,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        name: str = "",
    ):
        self.model, self.model_config, self.tokenizer = model, model_config, tokenizer
        self.config = config or EngineConfig()
        self.device, self.dtype, self.name = device or torch.device("cpu"), dtype, name
        device = self.device
        self.max_model_len = min(
            self.config.max_model_len or model_config.context_window, model_config.context_window
        )
        num_pages = self._num_pages()
        self._check_pool_size(num_pages)  # (before the block manager lists its pages)
        self.block_manager = BlockManager(
            num_pages, self.config.page_size, self.config.enable_prefix_caching
        )
        eos = set(model_config.eos_token_ids)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_token_ids = eos
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            eos_token_ids=eos,
        )
        self.runner = ModelRunner(
            model, model_config, self.config, self.max_model_len, num_pages, device, dtype
        )
        self.requests: dict[int, Request] = {}
        self._lock = threading.RLock()
        self._ahead: tuple | None = None  # (SchedulerOutput, handle) launched, not yet read
        self.sessions: dict[str, EngineSession] = {}  # open sessions, by id
        self.weights_mode = "dense"  # "int4" when decode runs the GGUF's 4-bit blocks
        self._identity: dict[str, str] | None = None
        self.steps_launched_ahead = 0
        self.spec = None  # engine.spec.decoder.SpecDecoder when speculative decoding is on
        spec_cfg = self.config.speculate
        if spec_cfg is not None and spec_cfg.mode != "off":
            from engine.spec.decoder import SpecDecoder, make_proposer

            self.spec = SpecDecoder(self, spec_cfg, make_proposer(spec_cfg, self))

    # -- construction ----------------------------------------------------------------------

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
        "int4", on the CPU, decodes through the GGUF's own 4-bit blocks (Q4_0, Q4_1, Q4_K),
        per-row int8 requantizations of its 5- to 8-bit ones (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0)
        and an int8 output head, and prefills with dense weights (bf16 where the CPU has AMX):
        fast and close to, not identical with, the reference. "auto" picks int4 where the
        checkpoint has such weights and the device is the CPU, else dense."""
        fast = False
        if weights not in ("auto", "dense", "int4"):
            raise EngineError(f"unknown weights mode {weights!r}; use auto, dense or int4")
        dev = _pick_device(device)
        dt = _pick_dtype(dtype, dev)
        source = resolve_source(model)
        cfg = read_config(source)
        net = build_model(cfg, dev, dt)
        if source.kind == "dummy":
            init_dummy_weights(net, seed)
        else:
            load_checkpoint_weights(net, source.path)
            if weights != "dense":
                fast = _load_int4(net, source, dev, required=weights == "int4")
        tokenizer = load_tokenizer(source)
        engine = cls(net, cfg, tokenizer, config, dev, dt, name=source.name)
        engine.weights_mode = "int4" if fast else "dense"
        if fast and _cpu_has_amx():
            # the int4 mode is approximate already; its prefill attention runs in bf16 (AMX)
            engine.runner.prefill_attn_dtype = torch.bfloat16
        return engine

    def _check_pool_size(self, num_pages: int) -> None:
        """CacheFullError when the KV pool cannot fit where it goes: host memory (the CPU,
        or the host tier of a sparse GPU run), else the GPU (1e14 bytes of --host-kv-budget
        once took minutes and GiBs in the block manager before the pool's own check)."""
        from engine.kv_cache import KVCache, check_host_memory

        need = num_pages * KVCache.bytes_per_page(self.model_config, self.config.page_size,
                                                  self.dtype)  # fmt: skip
        if self.device.type == "cpu" or self.config.sparse is not None:
            check_host_memory(need)
            return
        total = torch.cuda.mem_get_info(self.device)[1]
        if need > total:
            raise CacheFullError(f"the KV pool needs {need / 2**30:.1f} GiB and the GPU has "
                                 f"{total / 2**30:.1f} GiB: lower --host-kv-budget")  # fmt: skip

    def _check_gpu_tier(self, length: int) -> None:
        """CacheFullError now, not mid-answer, when the GPU tier cannot hold one decode
        step's selection of a sequence of `length` tokens."""
        tiers = self.runner.tiers
        if tiers is None:
            return
        P = self.config.page_size
        need = self.model_config.num_kv_heads * tiers.sparse.budget_pages(-(-length // P), P)
        if need > tiers.num_slots:
            raise CacheFullError(
                f"the GPU KV budget holds {tiers.num_slots} pages per layer, fewer than the "
                f"{need} a step of this {length:,}-token sequence selects: raise "
                "--gpu-kv-budget or lower the sparse budget"
            )

    def _num_pages(self) -> int:
        cfg, P = self.config, self.config.page_size
        if cfg.num_pages:
            return cfg.num_pages
        from engine.kv_cache import KVCache

        page_bytes = KVCache.bytes_per_page(self.model_config, P, self.dtype)
        if cfg.kv_cache_memory:
            return max(1, cfg.kv_cache_memory // page_bytes)
        window_pages = -(-self.max_model_len // P)
        if self.device.type == "cuda" and cfg.sparse is not None:
            # the pool is the host tier (pinned host memory): room for the windows, capped at
            # half of the host memory available
            from engine.kv_cache import host_memory_available

            avail = host_memory_available() or (8 << 30)
            want = window_pages * cfg.max_num_seqs
            return max(window_pages, min(want, (avail // 2) // page_bytes))
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * 0.85) - (2 << 30)  # leave room for activations and graphs
            want = window_pages * cfg.max_num_seqs
            return max(window_pages, min(want, budget // page_bytes))
        # CPU: room for a few full windows, capped at 4 GiB
        return max(
            window_pages, min(window_pages * min(cfg.max_num_seqs, 4), (4 << 30) // page_bytes)
        )

    # -- tokens ----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def chat_tokens(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> list[int]:
        """The chat template's tokens; `tools` (JSON schemas) for templates that take them."""
        extra = {"tools": tools} if tools else {}
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, **extra
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return list(ids)

    # -- requests --------------------------------------------------------------------------

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        session: EngineSession | None = None,
        prefix: tuple[list[int], list[bytes]] | None = None,
    ) -> Request:
        """Queue a request. With a `session`, its finished pages stay pinned for the
        session's next turn; `prefix` (pages, chain hashes) names pages that already hold
        the prompt's first tokens, so they are reused without hash lookups."""
        params = params or SamplingParams()
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise EngineError("the prompt is empty")
        if len(ids) >= self.max_model_len:
            raise ContextTooLongError(
                len(ids), self.max_model_len, note=self.model_config.window_note
            )
        room = self.max_model_len - len(ids)
        if params.max_tokens > room:
            params = dataclasses.replace(params, max_tokens=room)
        self._check_gpu_tier(len(ids) + params.max_tokens)
        seq = Sequence(ids, params)
        if prefix is not None:
            seq.prefix_blocks, seq.prefix_hashes = list(prefix[0]), list(prefix[1])
        seq.keep_pages = session is not None
        detok = Detokenizer(self.tokenizer, params.stop) if self.tokenizer is not None else None
        req = Request(seq, detok)
        req.session = session
        with self._lock:
            self.requests[seq.seq_id] = req
            self.scheduler.add(seq)
        return req

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> None:
        """One forward pass over every running sequence; events go to each request.

        On CUDA, a greedy decode batch whose next step is predictable (same sequences, room in
        their pages, nobody waiting) gets that next step launched before this one's tokens
        are read back: the graph feeds its argmax to the next step's input on the device, so
        the GPU does not idle while the host does its bookkeeping."""
        with self._lock:
            for req in list(self.requests.values()):
                if req.cancelled.is_set() and not req.done:
                    self.scheduler.finish(req.seq, "cancelled")
                    self._finish(req)
            if self._ahead is not None:
                out, handle = self._ahead  # launched by the previous call
                self._ahead = None
            else:
                if not self.scheduler.has_unfinished():
                    return
                out = self.scheduler.schedule()
                if out.is_empty:
                    raise EngineError("the KV cache is too small for the waiting request")
                plan = self.spec.plan(out) if self.spec is not None else None
                if plan is not None:
                    self._speculative_step(out, *plan)
                    return
                handle = self.runner.launch(out) if self.runner.graph_eligible(out) else None
            if handle is not None:
                nxt = self._plan_ahead(out)
                if nxt is not None:
                    self._ahead = (nxt, self.runner.launch(nxt, ahead=True))
                    self.steps_launched_ahead += 1
                sampled = self.runner.collect(handle)
            else:
                t0 = time.perf_counter()
                sampled = self.runner.run(out)
                if (
                    self.spec is not None
                    and out.scheduled
                    and all(it.is_decode for it in out.scheduled)
                ):
                    self.spec.observe_plain_step(time.perf_counter() - t0)
            now = time.perf_counter()
            finished = self.scheduler.postprocess(out, sampled)
            for item in out.scheduled:
                req = self.requests.get(item.seq.seq_id)
                if req is not None:
                    self._emit(req, item, sampled, now)
            for seq in finished:
                req = self.requests.get(seq.seq_id)
                if req is not None and req.seq.is_finished:
                    self._finish(req)
            if self._ahead is not None and any(
                it.seq.is_finished for it in self._ahead[0].scheduled
            ):
                # the batch changed under the launched step: drop its results (its KV writes
                # land in slots nobody reads); the scheduler takes over again
                self._ahead = None

    def _speculative_step(self, out, drafts: dict, probs: dict) -> None:
        """Verify every sequence's draft in one forward, then commit the emitted tokens one
        at a time, as single decode steps would (a stop ends the sequence there), and roll
        back what the rejected positions took."""
        from engine.scheduler import ScheduledSeq, SchedulerOutput

        emitted = self.spec.verify(out, drafts, probs)
        now = time.perf_counter()
        for item in out.scheduled:
            seq = item.seq
            start, table = seq.num_computed_tokens, list(seq.block_table)
            req = self.requests.get(seq.seq_id)
            for token in emitted[seq.seq_id]:
                single = ScheduledSeq(seq, 1, True)
                self.scheduler.postprocess(SchedulerOutput([single], []), {seq.seq_id: token})
                if req is not None:
                    self._emit(req, single, {seq.seq_id: token}, now)
                if seq.is_finished:
                    break
            self.runner.after_verify(seq, start, table, self.block_manager)
            if req is not None and seq.is_finished:
                self._finish(req)

    def _plan_ahead(self, out):
        """The step after `out` if it is certain to be the same greedy decode batch, else None."""
        from engine.scheduler import ScheduledSeq, SchedulerOutput

        if self.spec is not None:  # each step may draft: nothing is certain
            return None
        if any(it.seq.is_finished for it in out.scheduled):
            # cancelled while its step was in flight: its blocks are gone (planning it would
            # take a whole context's worth of blocks for a finished sequence)
            return None
        if self.scheduler.waiting or any(r.cancelled.is_set() for r in self.requests.values()):
            return None
        for item in out.scheduled:
            seq = item.seq
            if (
                seq.num_completion_tokens + 1 >= seq.params.max_tokens
                or len(seq) + 1 >= self.max_model_len
            ):
                return None  # this step's token ends it
        if not all(
            self.block_manager.ensure_capacity(it.seq, len(it.seq) + 1) for it in out.scheduled
        ):
            return None
        nxt = SchedulerOutput([ScheduledSeq(it.seq, 1, True) for it in out.scheduled], [])
        return nxt if self.runner.graph_eligible(nxt) else None

    def _emit(self, req: Request, item, sampled: dict[int, int], now: float) -> None:
        seq = req.seq
        if not item.samples:
            req.events.append(
                StreamEvent(
                    "prefill",
                    prefilled=seq.num_computed_tokens,
                    prompt_tokens=seq.num_prompt_tokens,
                )
            )
            return
        token = sampled[seq.seq_id]
        if req.stats.completion_tokens == 0:
            req.stats.ttft_s = now - req.start
            req.stats.cached_tokens = seq.num_cached_tokens
            req.events.append(
                StreamEvent(
                    "prefill", prefilled=seq.num_prompt_tokens, prompt_tokens=seq.num_prompt_tokens
                )
            )
        req.stats.completion_tokens += 1
        text = ""
        if req.detok is not None and token not in self.eos_token_ids:
            req.detok.add(token)
            text = req.detok.delta()
            if req.detok.stopped and not seq.is_finished:
                self.scheduler.finish(seq, "stop")
        req.events.append(StreamEvent("token", text=text, token_ids=[token]))

    def _finish(self, req: Request) -> None:
        if any(e.kind == "done" for e in req.events) or req.seq.seq_id not in self.requests:
            return
        req.stats.total_s = time.perf_counter() - req.start
        if self.spec is not None:
            req.stats.speculation = self.spec.release(req.seq.seq_id)
        tail = req.detok.delta(final=True) if req.detok else ""
        if tail:
            req.events.append(StreamEvent("token", text=tail))
        if req.session is not None:
            req.session._finished(req.seq, self.runner.dense_kv.pop(req.seq.seq_id, None))
        req.events.append(StreamEvent("done", finish_reason=req.seq.finish_reason, stats=req.stats))
        self.runner.release(req.seq.seq_id)
        del self.requests[req.seq.seq_id]

    # -- sessions --------------------------------------------------------------------------

    def open_session(
        self, session_id: str, messages: list[dict] | None = None, snapshot: str | None = None
    ) -> EngineSession:
        """The live session `session_id` (opened if needed). `messages`: the conversation so
        far, rendered again by the next append(). `snapshot`: a KV snapshot file to restore
        the session's pages from; one that does not match this engine is refused
        (session.snapshot_error says why) and the next turn prefills as usual."""
        from engine.session import EngineSession

        session = self.sessions.get(session_id)
        if session is None:
            session = EngineSession(self, session_id)
            self.sessions[session_id] = session
        if messages is not None and not session.messages:
            session.messages = list(messages)
        if snapshot is not None and not session.token_ids:
            session.restore(snapshot)
        return session

    def kv_stats(self) -> dict:
        """Where the context's KV lives now, and what sparse decode fetched so far:
        host_tokens (pages in use x page size), gpu_tokens (for the tiered cache: the pages
        resident on the GPU per layer and head x page size; dense on a GPU: all of them),
        and for sparse decode: selected pages per layer-step, host fetch fraction, bytes
        fetched per layer-step."""
        P = self.config.page_size
        in_use = (self.block_manager.num_blocks - self.block_manager.num_free_blocks) * P
        tiers = self.runner.tiers
        if tiers is None:
            on_gpu = self.device.type == "cuda"
            return {"host_tokens": 0 if on_gpu else in_use, "gpu_tokens": in_use if on_gpu else 0}
        st = tiers.stats
        per_unit = tiers.L * tiers.Hkv
        return {
            "host_tokens": in_use,
            "gpu_tokens": tiers.resident_units() * P // per_unit,
            "selected_pages_per_step": st.selected / st.steps if st.steps else 0.0,
            "fetch_fraction": st.fetch_fraction,
            "fetched_bytes_per_step": st.fetched_bytes / st.steps if st.steps else 0.0,
            # Forecast prefetch: recall of the predicted pages, and the share of the fetched
            # pages that were fetched ahead of the attention that read them
            "forecast_recall": st.recall if st.recall_total else None,
            "prefetch_fraction": (
                st.prefetch_hits / (st.prefetch_hits + st.demand_fetched)
                if st.prefetch_hits + st.demand_fetched
                else None
            ),  # fmt: skip
            "prefetch": self._prefetch_state(),
        }

    def _prefetch_state(self) -> dict | None:
        """The Forecast prefetch policy's state (engine.kv.prefetch_policy): on or off now,
        the MiB per layer-step the steps needed from the host, the last trial's medians
        (ms per step without, with); None without a forecast."""
        tiers = self.runner.tiers
        if tiers is None or tiers.sparse.forecast == "off":
            return None
        last = tiers.trials.decisions[-1] if tiers.trials.decisions else None
        return {"policy": tiers.sparse.prefetch_policy, "on": tiers.prefetching(),
                "need_mib": tiers.need_mib, "trial_ms": list(last) if last else None}  # fmt: skip

    def kv_identity(self) -> dict[str, str]:
        """What KV computed by this engine depends on; a snapshot must match all of it."""
        if self._identity is None:
            from engine.snapshot import engine_identity

            self._identity = engine_identity(self)
        return dict(self._identity)

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
    from engine.scheduler import ScheduledSeq, SchedulerOutput

    if len(token_ids) > engine.max_model_len:  # (this pass samples nothing: == fits)
        note = engine.model_config.window_note
        raise ContextTooLongError(len(token_ids), engine.max_model_len, note=note)
    seq = Sequence(list(token_ids), SamplingParams(max_tokens=1))
    bm, runner = engine.block_manager, engine.runner
    with engine._lock:
        caching, bm.enable_prefix_caching = bm.enable_prefix_caching, False
        try:
            if not bm.can_allocate(seq):
                raise EngineError("the KV cache has no room for this prompt")
            bm.allocate(seq)
        finally:
            bm.enable_prefix_caching = caching
        try:
            out = SchedulerOutput([ScheduledSeq(seq, len(seq), True)], [])
            ids, positions, pages, offsets, rope_lens, _, qlens, kvlens, plists = runner.prepare(
                out
            )
            with torch.inference_mode():
                hidden = runner.eager_hidden(
                    ids, positions, pages, offsets, rope_lens, qlens, kvlens, plists
                )
                return engine.model.compute_logits(hidden).float()
        finally:
            bm.free(seq)
