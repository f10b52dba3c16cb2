"""Sparse decode quality against dense, on the real default model (CPU), ~7K-token documents.

python -m bench.sparse_quality [--tokens 6912] [--scored 256] [--positions 20] [--json F]

For page budgets of 2, 5, 10 and 20% of the context, with Quest (min/max) summaries, mean
summaries, and Quest with a stochastic tail (a quarter of the budget sampled in proportion to
exp(score), the rest top-k), against dense attention:
- perplexity of `--scored` tokens of a novel after `--tokens` tokens of it, teacher-forced
  one decode step at a time (sparse attention applies to decode steps; prefill is dense);
- greedy agreement: how often the sparse argmax at those steps equals the dense argmax;
- page-selection locality: the fraction of a layer's selected pages that it selected at the
  previous step;
- passkey retrieval: a five-digit key hidden at `--positions` depths of a novel excerpt,
  asked for after the document (user: document; assistant: "I have read it."; user:
  the question); 12 greedy tokens; a hit if the key's digits appear in them.

The dense prefill is computed once per document and shared by every configuration; each
configuration's decode steps overwrite the KV after the prompt.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

BOOK = Path(__file__).resolve().parents[2] / "shared" / "data" / "books" / "moby_dick.txt"


FORECAST = False  # --forecast: the Forecast configs instead of the summary/tail ones
FORECAST_KINDS = ("free",)  # --forecast-kinds: training-free and/or trained predictors
FORECAST_WEIGHTS = None  # --forecast-weights: the trained predictor's file (default: shipped)
BUDGETS = (0.02, 0.05, 0.10, 0.20)  # --budgets
LAYER_GROUPS = None  # --layer-groups: Quest selections shared by groups of layers instead
ONLY = None  # --only TEXT: dense and the configs whose name holds TEXT
PARTIAL = {}  # the --json file's fields, rewritten after every row (a run stopped part way
# through still leaves what it measured)


def save_partial() -> None:
    if PARTIAL.get("path"):
        Path(PARTIAL["path"]).write_text(json.dumps(PARTIAL["data"], indent=2))


def configs():
    return [(name, cfg) for name, cfg in all_configs() if ONLY is None or name == "dense"
            or ONLY in name]  # fmt: skip


def all_configs():
    from engine.kv import SparseConfig

    out = [("dense", None)]
    if FORECAST:
        for frac in BUDGETS:
            for kind in FORECAST_KINDS:
                tag = "" if kind == "free" else f" ({kind})"
                weights = FORECAST_WEIGHTS if kind == "trained" else None
                out.append((f"quest {frac:.0%} +forecast{tag}",
                            SparseConfig(budget_fraction=frac, forecast=kind,
                                         forecast_weights=weights)))  # fmt: skip
                out.append((f"quest {frac:.0%} forecast-only{tag}",
                            SparseConfig(budget_fraction=frac, forecast=kind, forecast_only=True,
                                         forecast_weights=weights)))  # fmt: skip
        return out
    if LAYER_GROUPS:  # one selection per group of consecutive layers (its first layer's)
        for frac in BUDGETS:
            for g in LAYER_GROUPS:
                name = f"quest {frac:.0%}" + (f" per {g} layers" if g > 1 else "")
                out.append((name, SparseConfig(budget_fraction=frac, layer_group=g)))
        return out
    for frac in BUDGETS:
        out.append((f"quest {frac:.0%}", SparseConfig(budget_fraction=frac)))
        out.append((f"mean {frac:.0%}", SparseConfig(budget_fraction=frac, summary="mean")))
        out.append((f"quest+tail {frac:.0%}", ("tail", frac)))
    return out


def resolve(cfg, n_pages: int):
    """A tail config: three quarters of the budget top-k, one quarter sampled."""
    from engine.kv import SparseConfig

    if isinstance(cfg, tuple):
        total = max(4, math.ceil(cfg[1] * n_pages))
        tail = max(1, total // 4)
        return SparseConfig(budget_tokens=(total - tail) * 16, tail_pages=tail, seed=0)
    return cfg


class Runner:
    """Drive the engine's model runner for one sequence: dense chunked prefill, then
    single-token steps (sparse when the tiers have a config)."""

    def __init__(self, engine, ids: list[int]) -> None:
        from engine.runtime.sequence import Sequence

        self.engine, self.runner, self.P = engine, engine.runner, engine.config.page_size
        bm = engine.block_manager
        bm.reset_prefix_cache()
        self.seq = Sequence(list(ids))
        caching, bm.prefix.enabled = bm.prefix.enabled, False
        bm.allocate(self.seq)
        bm.prefix.enabled = caching
        self.tiers = self.runner.tiers
        self.forecasts = {}

    def close(self) -> None:
        self.engine.block_manager.free(self.seq)

    def forward(self, ids: list[int], start: int) -> torch.Tensor:
        from engine.runtime.step_inputs import StepInputs

        P, bt = self.P, self.seq.block_table
        end = start + len(ids)
        batch = StepInputs(
            query_lens=[len(ids)], kv_lens=[end], ids=list(ids), positions=list(range(start, end)),
            pages=[bt[p // P] for p in range(start, end)],
            offsets=[p % P for p in range(start, end)], rope_lens=[end] * len(ids),
            page_lists=[bt[: -(-end // P)]],
        )  # fmt: skip
        with torch.inference_mode():
            hidden = self.runner.eager_hidden(batch)
            return self.engine.model.compute_logits(hidden[-1:])[0].float()

    def prefill(self, n: int, chunk: int = 512) -> torch.Tensor:
        self.runner.tiers = self.tiers
        ids = self.seq.token_ids
        for s in range(0, n, chunk):
            logits = self.forward(ids[s : min(n, s + chunk)], s)
        return logits

    def use(self, cfg) -> None:
        """Dense (None) or a sparse config for the next steps; stats and locality reset."""
        from engine.runtime.model_runner import make_forecast

        self.runner.tiers = None if cfg is None else self.tiers
        if cfg is not None:
            if cfg.forecast != "off":  # the predictor this config names (built once a kind)
                if cfg.forecast not in self.forecasts:
                    self.forecasts[cfg.forecast] = make_forecast(self.engine.model, cfg)
                self.tiers.forecast = self.forecasts[cfg.forecast]
            self.tiers.reconfigure(cfg)
            self.tiers.reset_stats()

    def rebuild_summary(self, n_prompt: int) -> None:
        """The prompt's last page may be partial: drop rows a previous run appended after
        the prompt from its summaries (and its stale slots), keeping the prompt's rows."""
        from kernels.page_score import reset_summaries

        P, t = self.P, self.tiers
        rows = n_prompt % P
        if rows == 0:
            return
        page = self.seq.block_table[n_prompt // P]
        units = torch.arange(t.Hkv, device=t.selection.summ[0].device) + page * t.Hkv
        t.drop_pages([page])  # its stale slots, every layer
        for layer in range(t.L):
            reset_summaries(t.selection.summ[layer], units)
            s = t.selection.summ[layer]
            k = t.host[layer, page, :, 0, :rows].to(s.device).float()  # [Hkv, rows, D]
            s[units, 0], s[units, 1], s[units, 2] = k.amin(1), k.amax(1), k.sum(1)


def perplexity(engine, text_ids: list[int], n_ctx: int, n_scored: int, rows: list,
               chunk: int = 512) -> None:  # fmt: skip
    ids = text_ids[: n_ctx + n_scored + 1]
    run = Runner(engine, ids)
    run.prefill(n_ctx, chunk)
    n_pages = -(-n_ctx // 16)
    dense_argmax = None
    for name, cfg in configs():
        cfg = resolve(cfg, n_pages)
        run.use(cfg)
        t = time.perf_counter()
        nll, argmax = 0.0, []
        for pos in range(n_ctx, n_ctx + n_scored):
            logits = run.forward([ids[pos]], pos)
            nll -= torch.log_softmax(logits, -1)[ids[pos + 1]].item()
            argmax.append(int(logits.argmax()))
        if dense_argmax is None:
            dense_argmax = argmax
        row = {
            "config": name,
            "perplexity": math.exp(nll / n_scored),
            "greedy_agreement": sum(a == b for a, b in zip(argmax, dense_argmax, strict=True))
            / n_scored,
            "seconds": time.perf_counter() - t,
        }
        if cfg is not None:
            st = run.tiers.stats
            row.update(
                locality=st.locality, pages_per_step=st.selected / max(st.steps, 1) / run.tiers.Hkv
            )
            if cfg.forecast != "off":
                by_layer = run.tiers.prefetcher.recall_by_layer.tolist()
                row.update(recall=st.recall, prefetch_hits=st.prefetch_hits,
                           prefetch_waste=st.prefetch_waste, demand_fetched=st.demand_fetched,
                           recall_by_layer=[h / t if t else None for h, t in by_layer])  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
        save_partial()
    run.close()


def passkey(engine, text_ids: list[int], n_ctx: int, positions: int, rows: list,
            chunk: int = 512) -> None:  # fmt: skip
    rng = random.Random(0)
    tok = engine.tokenizer
    names = [name for name, _ in configs()]
    hits = {name: 0 for name in names}
    for i in range(positions):
        key = str(rng.randrange(10000, 100000))
        needle = tok.encode(f" The pass key is {key}. Remember it. {key} is the pass key. ",
                            add_special_tokens=False)  # fmt: skip
        depth = int((i + 0.5) / positions * (n_ctx - len(needle) - 200))
        body = text_ids[:depth] + needle + text_ids[depth : n_ctx - len(needle) - 200]
        messages = [
            {"role": "user", "content": tok.decode(body)},
            {"role": "assistant", "content": "I have read it."},
            {"role": "user", "content": "What is the pass key? Answer with the number only."},
        ]
        ids = engine.chat_tokens(messages)
        run = Runner(engine, ids + [0] * 12)
        run.prefill(len(ids) - 1, chunk)
        n_pages = -(-len(ids) // 16)
        for name, cfg in configs():
            run.use(resolve(cfg, n_pages))
            run.rebuild_summary(len(ids) - 1)
            out, last = [], ids[-1]
            for step in range(12):
                logits = run.forward([last], len(ids) - 1 + step)
                last = int(logits.argmax())
                out.append(last)
            answer = tok.decode(out)
            hits[name] += key in answer.replace(" ", "")
        run.close()
        print(json.dumps({"position": i, "depth": depth, "key": key,
                          "hits_so_far": hits}), flush=True)  # fmt: skip
        PARTIAL.get("data", {})["passkey_so_far"] = {"positions": i + 1, "hits": dict(hits)}
        save_partial()
    for name in names:
        rows.append({"config": name, "passkey_accuracy": hits[name] / positions})


def main() -> None:
    from bench.scorers import keep_all_summaries
    from engine import Engine
    from engine.config import EngineConfig
    from engine.kv import SparseConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=6912, help="context before the scored tokens")
    ap.add_argument("--scored", type=int, default=256)
    ap.add_argument("--positions", type=int, default=20)
    ap.add_argument("--passkey-tokens", type=int, default=None, help="default: --tokens")
    ap.add_argument("--no-perplexity", action="store_true")
    ap.add_argument("--weights", default="auto")
    ap.add_argument(
        "--model", default=None, help="a GGUF or checkpoint; default: the default model"
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kv-dtype", default="auto", choices=["auto", "fp8"],
                    help="the KV pool's dtype (EngineConfig.kv_dtype)")  # fmt: skip
    ap.add_argument("--yarn", type=float, default=None,
                    help="YaRN RoPE scaling by this factor over the model's window (Qwen2.5's "
                    "long-context recipe: 4)")  # fmt: skip
    ap.add_argument("--book", default=str(BOOK))
    ap.add_argument("--chunk", type=int, default=512, help="prefill chunk (tokens)")
    ap.add_argument(
        "--budgets",
        type=float,
        nargs="+",
        default=None,
        help="default: 0.02 0.05 0.10 0.20 (0.02 0.05 0.10 with --forecast)",
    )
    ap.add_argument("--forecast", action="store_true", help="Forecast configs (issue 6)")
    ap.add_argument("--layer-groups", type=int, nargs="+", default=None,
                    help="Quest configs whose selection is shared by groups of this many "
                    "layers (1: each layer its own)")  # fmt: skip
    ap.add_argument("--forecast-kinds", nargs="+", default=["free"], choices=["free", "trained"])
    ap.add_argument("--forecast-weights", default=None, help="default: the shipped file")
    ap.add_argument("--only", default=None, help="dense and the configs whose name holds this")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    global FORECAST, FORECAST_KINDS, FORECAST_WEIGHTS, BUDGETS, ONLY, LAYER_GROUPS
    FORECAST_WEIGHTS, LAYER_GROUPS = args.forecast_weights, args.layer_groups
    FORECAST, FORECAST_KINDS, BUDGETS, ONLY = (args.forecast, tuple(args.forecast_kinds),
                                               args.budgets, args.only)  # fmt: skip
    BUDGETS = tuple(BUDGETS or ((0.02, 0.05, 0.10) if FORECAST else (0.02, 0.05, 0.10, 0.20)))
    sparse = SparseConfig(budget_fraction=1.0, forecast=args.forecast_kinds[0])
    longest = max(args.tokens + args.scored, args.passkey_tokens or 0) + 64
    rope = {"rope_type": "yarn", "factor": args.yarn} if args.yarn else None
    cfg = EngineConfig(sparse=sparse, max_num_batched_tokens=args.chunk, max_num_seqs=1,
                       num_pages=-(-longest // 16) + 16, rope_scaling=rope,
                       kv_dtype=args.kv_dtype)  # fmt: skip
    engine = Engine.load(args.model, device=args.device, dtype=args.dtype, weights=args.weights,
                         config=cfg)  # fmt: skip
    keep_all_summaries(engine)  # all three summary rows: each config picks Quest or mean
    text = Path(args.book).read_text(encoding="utf-8")[200_000:]  # past the front matter
    text_ids = engine.encode(text)[: args.tokens + args.scored + 8]
    ppl, keys = [], []
    result = {"args": vars(args), "weights": engine.weights_mode, "model": engine.name,
              "device": str(engine.device), "dtype": str(engine.dtype),
              "window": engine.max_model_len, "perplexity": ppl, "passkey": keys}  # fmt: skip
    PARTIAL.update(path=args.json, data=result)
    if not args.no_perplexity:
        perplexity(engine, text_ids, args.tokens, args.scored, ppl, args.chunk)
    if args.positions:
        passkey(engine, text_ids, args.passkey_tokens or args.tokens, args.positions, keys,
                args.chunk)  # fmt: skip
    acc = {r["config"]: r["passkey_accuracy"] for r in keys}
    print(f"\n{'config':28s} {'perplexity':>10s} {'greedy agree':>12s} {'locality':>9s}"
          f" {'pages/step':>10s} {'passkey':>8s} {'recall':>7s}")  # fmt: skip
    for r in ppl or [{"config": k} for k in acc]:
        print(f"{r['config']:28s} {r.get('perplexity', float('nan')):10.3f}"
              f" {r.get('greedy_agreement', float('nan')):12.1%}"
              f" {r.get('locality', float('nan')):9.1%} {r.get('pages_per_step', float('nan')):10.1f}"
              f" {acc.get(r['config'], float('nan')):8.0%} {r.get('recall', float('nan')):7.1%}")  # fmt: skip
    result.pop("passkey_so_far", None)
    save_partial()


if __name__ == "__main__":
    main()
