"""Command-line options that shape the engine: sparse decode over the tiered KV cache, the
byte budgets of its tiers, Forecast prefetch, and speculative decoding."""

from __future__ import annotations

import click

from agentctx.kv_snapshots import BudgetError, parse_size


def kv_options(f):
    """--sparse, --gpu-kv-budget, --host-kv-budget, --kv-dtype, --forecast, --prefetch,
    --speculate and --rope-scaling, for `ask`, `tui` and `serve`."""
    f = _choice(f, "--kv-dtype", ["auto", "fp8"], "auto",
                "The KV cache's dtype: auto (the model's) or fp8 (e4m3: half of bf16's bytes in "
                "both tiers and in host fetches; needs --sparse).")  # fmt: skip
    f = click.option(
        "--rope-scaling",
        default=None,
        metavar="TYPE:FACTOR",
        help="Stretch the model's window by FACTOR with RoPE scaling of TYPE (yarn or linear), "
        "e.g. yarn:4 for Qwen2.5 past 32K tokens, as Qwen documents. Without it, the model's "
        "own window.",
    )(f)
    f = click.option(
        "--speculate",
        default="auto",
        show_default=True,
        metavar="MODE",
        help="Speculative decoding: off, lookup (drafts copied from the context), self (the "
        "model drafts over a window of its own KV), lookup+self (lookup where the context "
        "holds a continuation, else self), draft:PATH (a small model of the same tokenizer), "
        "or auto (lookup). Greedy output is unchanged.",
    )(f)
    f = _choice(f, "--forecast", ["off", "free", "trained"], "off",
                "Prefetch the next layer's predicted pages (needs --sparse): the training-free "
                "predictor, or the trained one shipped for the model.")  # fmt: skip
    f = _choice(f, "--prefetch", ["timed", "always"], "timed",
                "When --forecast prefetches: timed (only while decode steps fetch many pages "
                "from the host and, timed both ways now and then, run faster with it) or "
                "always.")  # fmt: skip
    f = click.option(
        "--host-kv-budget",
        default=None,
        help="Bytes of host memory for the KV pool, e.g. 64GiB (default: sized from the window).",
    )(f)
    f = click.option(
        "--gpu-kv-budget",
        default=None,
        help="Bytes of GPU memory for the sparse working set, e.g. 24GiB (needs --sparse).",
    )(f)
    f = click.option(
        "--sparse",
        default=None,
        metavar="BUDGET",
        help="Sparse decode attention reading BUDGET of each sequence's pages: 2% or 4096 (tokens).",
    )(f)
    return f


def _choice(f, name: str, choices: list[str], default: str, help: str):
    return click.option(name, type=click.Choice(choices), default=default, show_default=True,
                        help=help)(f)  # fmt: skip


def engine_config(sparse: str | None, gpu_kv_budget: str | None, host_kv_budget: str | None,
                  forecast: str = "off", speculate: str = "off", prefetch: str = "timed",
                  rope_scaling: str | None = None, kv_dtype: str = "auto"):  # fmt: skip
    """An EngineConfig for the options, with the user's cache folder; bad values raise
    click.BadParameter (exit 2)."""
    config = _engine_config(sparse, gpu_kv_budget, host_kv_budget, forecast, speculate, prefetch)
    config.rope_scaling = parse_rope_scaling(rope_scaling)
    if kv_dtype == "fp8" and config.sparse is None:
        raise click.BadParameter("fp8 KV is for the tiered cache: it needs --sparse",
                                 param_hint="--kv-dtype")  # fmt: skip
    config.kv_dtype = kv_dtype
    return config


def parse_rope_scaling(text: str | None) -> dict | None:
    """--rope-scaling TYPE:FACTOR -> the engine's rope_scaling override (the model checks the
    rest when it loads: engine.config.ModelConfig.with_rope_scaling)."""
    if text is None:
        return None
    kind, _, factor = text.strip().partition(":")
    try:
        value = float(factor)
    except ValueError:
        value = 0.0
    if kind not in ("yarn", "linear") or not value > 1 or value > 64:
        raise click.BadParameter(
            f"{text!r}: use TYPE:FACTOR with TYPE yarn or linear and a FACTOR above 1 and "
            "at most 64, e.g. yarn:4",
            param_hint="--rope-scaling",
        )
    return {"rope_type": kind, "factor": value}


def _engine_config(sparse, gpu_kv_budget, host_kv_budget, forecast, speculate, prefetch):
    from agentctx.app_paths import cache_dir
    from engine.config import EngineConfig
    from engine.spec.decoder import SpecConfig

    try:
        spec = SpecConfig(speculate.strip()) if speculate.strip() != "off" else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--speculate") from None
    if (sparse is None and gpu_kv_budget is None and host_kv_budget is None
            and forecast == "off" and spec is None):  # fmt: skip
        return EngineConfig(cache_dir=cache_dir())
    from engine.kv import SparseConfig

    sparse_cfg = None
    if sparse is not None:
        try:
            if sparse.strip().endswith("%"):
                sparse_cfg = SparseConfig(budget_fraction=float(sparse.strip()[:-1]) / 100)
            else:
                sparse_cfg = SparseConfig(budget_tokens=int(sparse))
        except ValueError as e:
            raise click.BadParameter(f"{sparse!r}: use a percentage (2%) or tokens ({e})",
                                     param_hint="--sparse") from None  # fmt: skip
    elif gpu_kv_budget is not None:
        raise click.BadParameter("a GPU KV budget needs --sparse", param_hint="--gpu-kv-budget")
    elif forecast != "off":
        raise click.BadParameter("Forecast prefetch needs --sparse", param_hint="--forecast")
    if sparse_cfg is not None:
        sparse_cfg.forecast = forecast
        sparse_cfg.prefetch_policy = prefetch  # "timed": engine.kv.prefetch_policy
    if gpu_kv_budget is not None:
        sparse_cfg.gpu_kv_budget = _budget(gpu_kv_budget, "--gpu-kv-budget")
    host = _budget(host_kv_budget, "--host-kv-budget") if host_kv_budget is not None else None
    return EngineConfig(sparse=sparse_cfg, kv_cache_memory=host, speculate=spec,
                        cache_dir=cache_dir())  # fmt: skip


def _budget(text: str, option: str) -> int:
    """Bytes of a KV budget: a size of at least one byte (0 would hold no KV; left out, the
    budget is sized for the window)."""
    try:
        size = parse_size(text)
    except BudgetError as e:
        raise click.BadParameter(str(e), param_hint=option) from None
    if size == 0:
        raise click.BadParameter(
            f"{text!r} holds no KV; give a size such as 8GiB, or leave it out to size it "
            "from the window",
            param_hint=option,
        )
    return size
