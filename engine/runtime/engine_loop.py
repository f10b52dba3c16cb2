"""The engine loop over token ids: requests join a continuous batch, and every `step()` runs
one forward pass over all running sequences. A stream drives `step()` from the thread that
iterates it and can be cancelled from any other thread; the tokens produced so far are kept.
engine.runtime.llm_engine.Engine adds loading, chat templates and the convenience calls.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import torch

from engine.config import EngineConfig, ModelConfig
from engine.errors import ContextTooLongError, EngineError, StepCancelled
from engine.kv.dense_kv import DenseKV
from engine.kv.session import EngineSession
from engine.kv.snapshot import engine_identity
from engine.runtime.block_manager import BlockManager
from engine.runtime.detokenizer import Detokenizer
from engine.runtime.kv_sizing import check_gpu_tier, check_pool_size, num_pages
from engine.runtime.kv_stats import kv_stats
from engine.runtime.model_runner import ModelRunner
from engine.runtime.requests import Request, StreamEvent
from engine.runtime.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from engine.runtime.sequence import Sequence
from engine.sampling_params import SamplingParams
from engine.spec.decoder import SpecDecoder, make_proposer


class EngineLoop:
    """The requests, the scheduler and block manager over the KV pool, the model runner and
    the speculative decoder, and the step that drives them."""

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
        pages = num_pages(self.config, model_config, self.max_model_len, device, dtype)
        # (checked before the block manager lists its pages)
        check_pool_size(pages, self.config, model_config, device, dtype)
        self.block_manager = BlockManager(
            pages, self.config.page_size, self.config.enable_prefix_caching
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
            model, model_config, self.config, self.max_model_len, pages, device, dtype
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
            proposer = make_proposer(spec_cfg, self.runner, self.config.cache_dir)
            self.spec = SpecDecoder(self.runner, self.block_manager, spec_cfg, proposer)

    # -- tokens ----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # -- requests --------------------------------------------------------------------------

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        session: EngineSession | None = None,
        prefix: tuple[list[int], list[bytes]] | None = None,
        dense_kv: DenseKV | None = None,
    ) -> Request:
        """Queue a request. With a `session`, its finished pages stay pinned for the
        session's next turn; `prefix` (pages, chain hashes) names pages that already hold
        the prompt's first tokens, so they are reused without hash lookups. `dense_kv`: the
        CPU runner's contiguous copy of the session's last turn, whose first rows are the
        prefix's (the same tokens, the same KV), so they are not gathered again."""
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
        length = len(ids) + params.max_tokens
        check_gpu_tier(self.runner.tiers, self.config, self.model_config, length)
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
            if dense_kv is not None:
                self.runner.dense_kv[seq.seq_id] = dense_kv
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
                if req.cancelled.is_set():
                    self._cancel(req)
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
                try:
                    sampled = self.runner.run(out, stop=all_cancelled(self.requests, out))
                except StepCancelled:  # everyone in it went while it ran: end them now
                    for item in out.scheduled:
                        self._cancel(self.requests.get(item.seq.seq_id))
                    return
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
            # a stop string ends a sequence in _emit, after postprocess listed the finished
            for seq in [*finished, *(it.seq for it in out.scheduled)]:
                req = self.requests.get(seq.seq_id)
                if req is not None and req.seq.is_finished:
                    self._finish(req)
            if self._ahead is not None and any(
                it.seq.is_finished for it in self._ahead[0].scheduled
            ):
                # the batch changed under the launched step: drop its results (its KV writes
                # land in slots nobody reads); the scheduler takes over again
                self._ahead = None

    def _cancel(self, req) -> None:
        if req is not None and not req.done:
            self.scheduler.finish(req.seq, "cancelled")
            self._finish(req)

    def _speculative_step(self, out, drafts: dict, probs: dict) -> None:
        """Verify every sequence's draft in one forward, then commit the emitted tokens one
        at a time, as single decode steps would (a stop ends the sequence there), and roll
        back what the rejected positions took."""
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
        """The step after `out` if it is certain to be the same greedy decode batch, else None.
        With speculation, only while lookup finds nothing to draft (SpecDecoder.ahead_ok)."""
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
        if not self.runner.graph_eligible(nxt):
            return None
        # (last: it counts the step as launched ahead)
        return nxt if self.spec is None or self.spec.ahead_ok(out) else None

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
        session = self.sessions.get(session_id)
        if session is None:
            session = EngineSession(self, session_id)
            self.sessions[session_id] = session
        if messages is not None and not session.messages:
            session.messages = list(messages)
        if snapshot is not None and not session.token_ids:
            session.restore(snapshot)
        return session

    def close_session(self, session_id: str, blocks: list[int]) -> None:
        """Forget an open session and unpin its pages: they stay cached (LRU) for anyone
        with the prefix."""
        with self._lock:
            self.block_manager.release(blocks)
            self.sessions.pop(session_id, None)

    def kv_stats(self) -> dict:
        """Where the context's KV lives now, and what sparse decode fetched so far
        (engine.runtime.kv_stats)."""
        return kv_stats(self.block_manager, self.runner.tiers, self.config.page_size, self.device)

    def kv_identity(self) -> dict[str, str]:
        """What KV computed by this engine depends on; a snapshot must match all of it."""
        if self._identity is None:
            self._identity = engine_identity(self)
        return dict(self._identity)


def all_cancelled(requests: dict, out):
    """A check the runner makes between layers of a prefill: whether every request of the
    step has been cancelled since it began (None for a step of decodes, which the runner
    does not stop, or where some sequence has no request)."""
    if all(item.is_decode for item in out.scheduled):
        return None
    reqs = [requests.get(item.seq.seq_id) for item in out.scheduled]
    if not reqs or None in reqs:
        return None
    flags = [req.cancelled for req in reqs]
    return lambda: all(flag.is_set() for flag in flags)
