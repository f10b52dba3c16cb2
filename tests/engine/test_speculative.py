"""Speculative decoding in the engine (tiny random model, fast): greedy output is token for
token the non-speculative output with every proposer, dense and sparse, alone and batched;
rollback returns every page and slot; sampling keeps the target's distribution; the draft
rings do not grow with the context."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from engine import SamplingParams
from engine.kv import SparseConfig
from engine.runtime.llm_engine import prompt_logits
from engine.spec.decoder import SpecConfig, SpecDecoder
from engine.spec.proposers import Draft, Proposer
from tests.engine.conftest import load_engine, tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cfg = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    return tiny_checkpoint(tmp_path_factory, "spec", cfg)


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    motif = torch.randint(0, 300, (30,), generator=g).tolist()
    # a repetitive one (lookup drafts accepted), two plain ones of other lengths
    return [motif * 5, torch.randint(0, 300, (70,), generator=g).tolist(),
            torch.randint(0, 300, (23,), generator=g).tolist()]  # fmt: skip


PARAMS = SamplingParams(max_tokens=36, ignore_eos=True)
PENALISED = SamplingParams(max_tokens=36, ignore_eos=True, repetition_penalty=1.3)
SPARSE = dict(budget_fraction=0.3)


@pytest.mark.parametrize("sparse", [False, True, "fp8"], ids=["dense", "sparse", "sparse-fp8"])
@pytest.mark.parametrize("mode", ["lookup", "self", "lookup+self", "draft"])
def test_greedy_speculation_is_token_identical(checkpoint, mode, sparse):
    """(sparse-fp8: the tiers hold fp8 rows, EngineConfig.kv_dtype; accepted rows fold into
    the summaries from the fp8 host tier)"""
    kv = {"kv_dtype": "fp8"} if sparse == "fp8" else {}

    def load_engine(path, **cfg):
        return globals()["load_engine"](path, **cfg, **kv)

    sp = SparseConfig(**SPARSE) if sparse else None
    expected = [c.token_ids for c in load_engine(checkpoint, sparse=sp).generate(prompts(), PARAMS)]
    # a fixed draft length: the adaptive policy follows measured step times, so how many
    # drafts it makes (not which tokens come out) varies with the machine's load
    spec = SpecConfig(mode=f"draft:{checkpoint}" if mode == "draft" else mode, window=24,
                      adaptive=False)  # fmt: skip
    engine = load_engine(checkpoint, sparse=SparseConfig(**SPARSE) if sparse else None,
                         speculate=spec)  # fmt: skip
    got = engine.generate(prompts(), PARAMS)  # batched: each sequence accepts its own count
    assert [c.token_ids for c in got] == expected
    # with a repetition penalty: each position's argmax sees the draft tokens before it
    plain = load_engine(checkpoint, sparse=SparseConfig(**SPARSE) if sparse else None)
    want = [c.token_ids for c in plain.generate(prompts(), PENALISED)]
    assert [c.token_ids for c in engine.generate(prompts(), PENALISED)] == want
    assert want != expected
    stats = [c.stats.speculation for c in got]
    assert sum(s.steps for s in stats) > 0 and sum(s.accepted for s in stats) > 0
    if mode == "lookup":  # the model's own loops are drafted and accepted
        assert sum(s.accepted for s in stats) >= 10
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    if sparse:  # verification steps went through the tiers
        assert engine.runner.tiers.stats.steps > 0


class Corrupted(Proposer):
    """Proposes the true greedy continuation with one token changed at a random place (or
    none): every verification accepts some and rejects the rest."""

    name = "corrupted"

    def __init__(self, truth: list[int], prompt_len: int, seed: int = 0) -> None:
        self.truth, self.n0 = truth, prompt_len
        self.g = torch.Generator().manual_seed(seed)

    def propose(self, seq, k, generator=None) -> Draft:
        done = len(seq) - self.n0
        d = list(self.truth[done : done + k])
        if d and torch.rand(1, generator=self.g) < 0.8:
            i = int(torch.randint(0, len(d), (1,), generator=self.g))
            d[i] = (d[i] + 1) % 300
        return Draft(d)


def test_rollback_returns_every_page_and_slot(checkpoint):
    """Over 100 verifications with forced rejections, a GPU tier far smaller than the context:
    after every step the sequence holds exactly the blocks its tokens need, no slot holds a
    page that left it, and the counters balance; at the end every block is free."""
    prompt = prompts()[1]
    n = 420
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    unit = 2 * 16 * 16 * 4  # one page of one head: K and V, 16 rows of 16 floats
    sparse = SparseConfig(budget_tokens=64, gpu_kv_budget=2 * 24 * unit)  # 24 of 62 pages
    truth = load_engine(checkpoint, sparse=sparse).generate([prompt], params)[0].token_ids
    engine = load_engine(checkpoint, sparse=sparse, page_size=16, speculate=SpecConfig("lookup"))
    fixed = SpecConfig("lookup", max_k=8, start_k=6, adaptive=False)  # keep drafting
    engine.spec = SpecDecoder(engine.runner, engine.block_manager, fixed,
                              Corrupted(truth, len(prompt)))  # fmt: skip
    bm, tiers = engine.block_manager, engine.runner.tiers
    start_free = bm.num_free_blocks
    req = engine.add_request(prompt, params)
    steps = 0
    while not req.done:
        engine.step()
        seq = req.seq
        if req.done:
            break
        steps += 1
        # the computed tokens' blocks, and at most the next token's: nothing past it
        assert -(-seq.num_computed_tokens // 16) <= len(seq.block_table) <= -(-len(seq) // 16)
        assert bm.num_free_blocks == start_free - len(seq.block_table)
        live = {p * 2 + h for p in seq.block_table for h in range(2)}
        for layer in range(tiers.L):
            held = tiers.residency.unit_in[layer, : tiers.num_slots]
            assert set(held[held >= 0].tolist()) <= live
        st = tiers.stats
        assert st.fetched - st.evicted - st.dropped == tiers.resident_units()
    spec = req.stats.speculation
    assert spec.steps >= 100 and 0 < spec.accepted < spec.drafted
    assert tiers.stats.dropped > 0 and tiers.stats.evicted > 0
    assert req.seq.completion_token_ids == truth
    assert bm.num_free_blocks == start_free


def test_sampling_keeps_the_target_distribution(tmp_path_factory, monkeypatch):
    """Vocabulary of 8: the joint distribution of the first two sampled tokens (the second
    from a verification of another random model's draft) over 3,000 seeded runs
    against the exact target probabilities. Chi-square at 63 degrees of freedom, p = 0.001:
    103.4. The same runs with a broken rule (every draft accepted) fail it."""
    cfg = LlamaConfig(
        vocab_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
    )  # fmt: skip
    path = tiny_checkpoint(tmp_path_factory, "spec_small_vocab", cfg)
    cfg.num_hidden_layers, cfg.hidden_size = 1, 16  # the draft: other weights, same vocabulary
    draft = tiny_checkpoint(tmp_path_factory, "spec_small_vocab_draft", cfg)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 8, (24,), generator=g).tolist()
    ref = load_engine(path)
    # exact joint: p(x1) p(x2 | x1)
    p1 = torch.softmax(prompt_logits(ref, prompt)[-1], -1)
    joint = torch.stack(
        [p1[a] * torch.softmax(prompt_logits(ref, prompt + [a])[-1], -1) for a in range(8)]
    )

    def chi2() -> float:
        spec = SpecConfig(f"draft:{draft}", max_k=2, start_k=2)
        # batches of 250 admitted at once: every run's second token is a verification's
        engine = load_engine(path, speculate=spec, max_num_seqs=250,
                             max_num_batched_tokens=8192, num_pages=1024)  # fmt: skip
        runs, counts, outs = 3000, torch.zeros(8, 8), []
        for first in range(0, runs, 250):
            params = [SamplingParams(max_tokens=3, temperature=1.0, seed=s, ignore_eos=True)
                      for s in range(first, first + 250)]  # fmt: skip
            outs += engine.generate([prompt] * 250, params)
        for c in outs:
            counts[c.token_ids[0], c.token_ids[1]] += 1
        assert sum(c.stats.speculation.steps for c in outs) >= runs
        expected = joint * runs
        return float(((counts - expected) ** 2 / expected).sum())

    assert chi2() < 103.4

    def accept_all(p, q, draft, generator=None):
        return list(draft) + [int(torch.multinomial(p[len(draft)], 1, generator=generator))]

    monkeypatch.setattr("engine.spec.decoder.accept_sampling", accept_all)
    assert chi2() > 103.4


def test_rings_do_not_grow_with_the_context(checkpoint):
    spec = SpecConfig("self", window=32, sinks=4, max_k=4)
    engine = load_engine(checkpoint, speculate=spec)
    req = engine.add_request(prompts()[1], SamplingParams(max_tokens=300, ignore_eos=True))
    sizes, ptrs = set(), set()
    while not req.done:
        engine.step()
        for ring in engine.spec.proposer.rings.values():
            sizes.add(ring.nbytes)
            ptrs.add(ring.k.data_ptr())
    assert len(req.seq) > 360 and len(sizes) == 1 and len(ptrs) == 1
    (size,) = sizes
    assert size < 2 * 2 * 2 * (4 + 32 + 5) * 32 * 4 + 8 * 41 + 1  # L x heads x cap x D x fp32


def test_verification_attention_is_each_query_alone():
    """The CPU verification path computes each query's attention bit for bit as the
    single-token decode path does (so greedy speculation reproduces plain decoding)."""
    from engine.layers.attention import _decode_attention_cpu, _verify_attention_cpu

    g = torch.Generator().manual_seed(1)
    Hkv, G, D = 3, 3, 64
    # (lengths that are and are not multiples of common block sizes)
    for L, T in ((3000, 5), (3075, 9), (2946, 4), (100, 3), (6745, 2)):
        q = torch.randn(1, Hkv * G, T, D, generator=g)
        k, v = torch.randn(Hkv, L, D, generator=g), torch.randn(Hkv, L, D, generator=g)
        out = _verify_attention_cpu(q, k, v, 0.125)
        for t in range(T):
            n = L - T + 1 + t
            one = q[:, :, t : t + 1].contiguous()
            alone = _decode_attention_cpu(one, k[:, :n], v[:, :n], 0.125)
            assert torch.equal(out[:, :, t : t + 1], alone), (L, T, t)
            ref = torch.softmax(torch.einsum("hgd,hnd->hgn", one.view(Hkv, G, D), k[:, :n])
                                * 0.125, -1) @ v[:, :n]  # fmt: skip
            assert torch.allclose(alone.view(Hkv, G, D), ref, atol=1e-5)


def test_fixed_union_width_is_exact_or_flags_overflow(checkpoint):
    """A verification captured in a CUDA graph lists each sequence's union of per-query
    pages in a fixed width: where the unions fit it gives the logits of the eager
    verification (whose width is the largest union), and where one does not fit it raises
    the overflow flag (the runner then verifies eagerly) instead of silently dropping pages."""
    from engine.runtime.scheduler import ScheduledSeq, SchedulerOutput

    engine = load_engine(checkpoint, sparse=SparseConfig(budget_fraction=0.25))
    reqs = [engine.add_request(p, SamplingParams(max_tokens=40, ignore_eos=True))
            for p in prompts()]  # fmt: skip
    while not all(r.stats.completion_tokens >= 3 for r in reqs):
        engine.step()
    runner, tiers, bm = engine.runner, engine.runner.tiers, engine.block_manager
    seqs = [r.seq for r in reqs]
    T = 5
    for s in seqs:
        assert bm.ensure_capacity(s, len(s) + T - 1)
    g = torch.Generator().manual_seed(0)
    out = SchedulerOutput([ScheduledSeq(s, T, True, draft=tuple(
        torch.randint(0, 300, (T - 1,), generator=g).tolist())) for s in seqs], [])  # fmt: skip
    eager = runner.verify(out)
    budget = tiers.budget_for(max(len(s) + T - 1 for s in seqs), runner.max_pages)
    wide = tiers.verify_width_for(len(seqs), T, budget, runner.max_pages)
    assert wide is not None and wide >= budget
    for width, overflow in ((wide, False), (1, True)):
        tiers.verify_overflow.zero_()
        tiers.verify_width = width
        try:
            got = runner.verify(out)
        finally:
            tiers.verify_width = None
        assert bool(tiers.verify_overflow) is overflow
        if not overflow:
            assert torch.equal(got, eager)


def test_lookup_and_self_is_lookup_where_it_matches_else_self(checkpoint):
    """`lookup+self`: the context's own continuation where the last tokens occurred before
    (free), the model's own window draft where they did not. (`auto` is lookup alone.)"""
    from engine.spec.decoder import make_proposer
    from engine.spec.proposers import LookupOrSelf, LookupProposer

    engine = load_engine(checkpoint)
    assert type(make_proposer(SpecConfig("auto"), engine.runner)) is LookupProposer
    proposer = make_proposer(SpecConfig("lookup+self"), engine.runner)
    assert isinstance(proposer, LookupOrSelf)
    reqs = [engine.add_request(p, SamplingParams(max_tokens=36, ignore_eos=True))
            for p in prompts()[:2]]  # fmt: skip
    repetitive, plain = (r.seq for r in reqs)
    lookup = LookupProposer()
    engine.step()  # prefill
    while not lookup.propose(repetitive, 4).tokens:  # until the model repeats itself
        assert not reqs[0].done, "the model never repeated its context"
        engine.step()
    assert len(lookup.propose(repetitive, 4).tokens) == 4
    assert proposer.propose(repetitive, 4).tokens == lookup.propose(repetitive, 4).tokens
    if not lookup.propose(plain, 4).tokens:  # (a random prompt: no earlier match)
        own = proposer.draft.propose(plain, 4).tokens
        assert proposer.propose(plain, 4).tokens == own and len(own) == 4
    else:
        pytest.fail("the random prompt repeats its last tokens: pick another seed")


def test_steps_go_ahead_only_while_lookup_finds_nothing(checkpoint):
    """A batch may have its next plain step launched before its tokens are read once every
    sequence's lookup found nothing QUIET_PLANS times in a row, for AHEAD_RUN steps at most
    before drafts are looked for again; a sequence with a continuation keeps it waiting."""
    from engine.runtime.scheduler import ScheduledSeq, SchedulerOutput
    from engine.spec.decoder import AHEAD_RUN, QUIET_PLANS
    from engine.spec.proposers import LookupProposer

    engine = load_engine(checkpoint, speculate=SpecConfig("lookup"))
    reqs = [engine.add_request(p, SamplingParams(max_tokens=36, ignore_eos=True))
            for p in prompts()[:2]]  # fmt: skip
    repetitive, plain = (r.seq for r in reqs)
    spec = engine.spec
    engine.step()  # prefill both (no plan: not a decode step)
    assert not LookupProposer().propose(plain, 4).tokens, "pick another seed"
    alone = SchedulerOutput([ScheduledSeq(plain, 1, True)], [])
    for _ in range(QUIET_PLANS - 1):
        assert spec.plan(alone) is None
        assert not spec.ahead_ok(alone)
    assert spec.plan(alone) is None
    assert [spec.ahead_ok(alone) for _ in range(AHEAD_RUN + 1)] == [True] * AHEAD_RUN + [False]
    assert spec.plan(alone) is None and spec.ahead_ok(alone)  # a plan starts a new run
    while not LookupProposer().propose(repetitive, 4).tokens:  # until the model repeats itself
        assert not reqs[0].done, "the model never repeated its context"
        engine.step()
    both = SchedulerOutput([ScheduledSeq(plain, 1, True), ScheduledSeq(repetitive, 1, True)], [])
    assert spec.plan(both) is not None  # the repetitive one drafts
    assert not spec.ahead_ok(both) and spec.quiet[repetitive.seq_id] == 0


def test_verify_staging_matches_the_list_tables():
    """The verification graph's inputs written with numpy (engine.runtime.verify_graphs) are the
    lists the eager path builds: each field's first B * T rows, the lengths, and each
    table padded with the scratch page to the end of its row; the padding rows (up to n
    sequences, tables up to the graph's `size`) read and write the scratch page only."""
    import numpy as np

    from engine.runtime.step_inputs import StepInputs
    from engine.runtime.verify_graphs import StagingShape, fill_verify_staging, verify_layout

    n, T, max_pages, size, scratch, P = 4, 3, 10, 2, 99, 16
    lay = verify_layout(n, T, max_pages)
    st = np.full(lay["tables"][1], -7, dtype=np.int64)
    ids, positions = [5, 6, 7], [20, 21, 22]
    pages, offsets = [1, 1, 2], [4, 5, 0]
    kv_lens, page_lists = [23], [[1, 2]]
    batch = StepInputs(ids=ids, positions=positions, pages=pages, offsets=offsets,
                       kv_lens=kv_lens, page_lists=page_lists)  # fmt: skip
    used = fill_verify_staging(st, StagingShape(n, T, max_pages, scratch, P), size, batch)
    assert used == lay["tables"][0] + size * max_pages
    pad_pos = [t for _ in range(n - 1) for t in range(T)]
    want = {"ids": ids + [0] * 9, "positions": positions + pad_pos,
            "pages": pages + [scratch] * 9, "offsets": offsets + [p % P for p in pad_pos],
            "kv_lens": kv_lens + [T] * 3}  # fmt: skip
    for name, values in want.items():
        a, b = lay[name]
        assert st[a:b].tolist() == values, name
    a = lay["tables"][0]
    tables = st[a:].reshape(n, max_pages)
    assert tables[0].tolist() == [1, 2] + [scratch] * 8
    assert tables[1].tolist() == [scratch] * max_pages  # a padding sequence of the graph
    assert (tables[2:] == -7).all()  # past the graph's rows: not written, not copied


def test_a_layer_hook_sees_each_layer_in_order_and_changes_nothing(checkpoint, monkeypatch):
    """StepContext.layer_hook (where a verification's graph capture splits, engine.
    verify_graphs) is called after every layer in order and leaves the outputs as they are."""
    from engine.models.causal_lm import CausalLM

    want = [c.token_ids for c in load_engine(checkpoint).generate(prompts()[:2], PARAMS)]
    seen: list[list[int]] = []
    forward = CausalLM.forward

    def hooked(self, input_ids, kv_layers, ctx):
        seen.append([])
        ctx.layer_hook = seen[-1].append
        return forward(self, input_ids, kv_layers, ctx)

    monkeypatch.setattr(CausalLM, "forward", hooked)
    got = [c.token_ids for c in load_engine(checkpoint).generate(prompts()[:2], PARAMS)]
    assert got == want
    assert seen and all(layers == [0, 1] for layers in seen)


def test_verify_staging_rewrites_only_what_may_have_changed():
    """With `held`, a staged table row is rewritten from the first entry that may differ
    (a block table grows and shrinks at its end only; a new one is a new list); after each
    of 300 random steps (growth, rollback trims, a sequence replaced, rows turning into
    padding and back, graphs of 2 and 4 sequences) the staging equals a fresh fill."""
    import random

    import numpy as np

    from engine.runtime.step_inputs import StepInputs
    from engine.runtime.verify_graphs import StagingShape, fill_verify_staging, verify_layout

    rng = random.Random(0)
    n, T, max_pages, scratch, P = 4, 2, 40, 999, 4
    lay = verify_layout(n, T, max_pages)
    st = np.zeros(lay["tables"][1], dtype=np.int64)
    held = [None] * n
    seqs = [{"table": [], "computed": 0} for _ in range(n)]
    next_page = iter(range(10**6))
    kept = 0
    for _ in range(300):
        bs = rng.randint(1, n)
        size = 2 if bs <= 2 and rng.random() < 0.5 else 4
        for s in seqs[:bs]:
            r = rng.random()
            if r < 0.1 or not s["table"]:  # a new sequence in this row (a new list)
                s["table"] = [next(next_page) for _ in range(rng.randint(1, 8))]
                s["computed"] = rng.randint(1, len(s["table"]) * P)
            else:  # tokens accepted; the rest rolled back (the table shrinks to them)
                s["computed"] = min(s["computed"] + rng.randint(0, 6), len(s["table"]) * P)
                if r < 0.6:
                    del s["table"][-(-s["computed"] // P) :]
                if r > 0.3:  # room for the next draft (fresh pages: other ids)
                    want = -(-(s["computed"] + rng.randint(1, 9)) // P)
                    s["table"].extend(next(next_page) for _ in range(want - len(s["table"])))
            s["table"][:] = s["table"][:max_pages]
        lists = [s["table"][:] for s in seqs[:bs]]
        zeros = [0] * bs * T
        args = dict(ids=zeros, positions=zeros, pages=zeros, offsets=zeros, kv_lens=[P] * bs,
                    page_lists=lists)  # fmt: skip
        kept += sum(h is not None and h[1] > 0 for h in held)
        shape = StagingShape(n, T, max_pages, scratch, P)
        batch = StepInputs(**args, block_tables=[s["table"] for s in seqs[:bs]],
                           stable_pages=[-(-s["computed"] // P) for s in seqs[:bs]])  # fmt: skip
        fill_verify_staging(st, shape, size, batch, held)
        fresh = np.full_like(st, -1)
        fill_verify_staging(fresh, shape, size, StepInputs(**args))
        end = lay["tables"][0] + size * max_pages
        assert (st[:end] == fresh[:end]).all()
    assert kept > 300  # (rows did keep entries from an earlier call)


def test_verify_graph_pieces_double_from_one_layer():
    """A verification's graphs (engine.runtime.verify_graphs): pieces of 1, 2, 4, ... layers, the
    last the rest, every layer in exactly one piece, at most the pieces asked for."""
    from engine.runtime.verify_graphs import verify_cuts

    assert sorted(verify_cuts(32, 4)) == [0, 2, 6]  # 1, 2, 4 and 25 layers
    assert sorted(verify_cuts(32, 5)) == [0, 2, 6, 14]  # ... 8 and 17
    for layers in range(1, 40):
        for chunks in range(1, 7):
            cuts = sorted(verify_cuts(layers, chunks))
            assert len(cuts) <= chunks - 1 and all(0 <= c < layers - 1 for c in cuts)
            bounds = [-1, *cuts, layers - 1]
            sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
            assert sum(sizes) == layers and all(s >= 1 for s in sizes)
            assert sizes[:-1] == [2**i for i in range(len(sizes) - 1)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("mode", ["lookup", "self", "draft"])
def test_greedy_speculation_on_the_gpu(checkpoint, mode):
    """On a GPU (fp32): verifications as decode-graph replays over one row per query
    (engine.runtime.verify_rows), drafts through the ring's step graph; the tokens are
    plain decoding's."""
    from engine import Engine
    from engine.config import EngineConfig

    def run(spec):
        e = Engine.load(checkpoint, device="cuda", config=EngineConfig(speculate=spec))
        return e, e.generate(prompts(), PARAMS)

    _, plain = run(None)
    spec = SpecConfig(mode=f"draft:{checkpoint}" if mode == "draft" else mode, window=24,
                      adaptive=False)  # fmt: skip
    engine, got = run(spec)
    assert [c.token_ids for c in got] == [c.token_ids for c in plain]
    stats = [c.stats.speculation for c in got]
    assert sum(s.steps for s in stats) > 0 and sum(s.accepted for s in stats) > 0
    # in graphs: one replay per verification of the batch (each sequence counts its own)
    assert 0 < engine.runner.verify_rows.replays <= sum(s.steps for s in stats)
    if mode != "lookup":  # (its step graphs are dropped with each finished sequence)
        assert engine.spec.proposer.graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_lookup_speculation_on_the_gpu_launches_quiet_steps_ahead(checkpoint):
    """With lookup drafts on and nothing to look up, plain steps are launched before the
    previous one's tokens are read (as with speculation off); the tokens are the same."""
    from engine import Engine
    from engine.config import EngineConfig

    g = torch.Generator().manual_seed(5)
    batch = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (40, 57)]

    def run(spec):
        e = Engine.load(checkpoint, device="cuda", config=EngineConfig(speculate=spec))
        return e, e.generate(batch, SamplingParams(max_tokens=40, ignore_eos=True))

    _, plain = run(None)
    engine, got = run(SpecConfig("lookup"))
    assert [c.token_ids for c in got] == [c.token_ids for c in plain]
    assert engine.steps_launched_ahead > 0
