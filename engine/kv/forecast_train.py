"""Train the Forecast predictor's low-rank corrections (engine.kv.forecast.TrainedForecast).

python -m engine.kv.forecast_train [--model PATH] [--device cpu|cuda] [--docs 48] [--tokens 4096] [--rank 8]
    [--steps 300] [--target selector|attention] [--out FILE] [--plot F.png] [--json F]

The shipped weights of the default model came from (CPU, 2 cores, ~10 minutes):
    python -m engine.kv.forecast_train --docs 20 --eval-docs 8 --samples 16 --steps 300 \
        --target selector --plot docs/forecast_training.png --json docs/forecast_training.json

Data (offline): Python source files of this interpreter's standard library, joined into
documents of `--tokens` tokens, and the novels in ../shared/data/books when present. Files
are split by a hash of their name: one in five is held out for evaluation, never trained on.

For each document, one dense forward pass records, at every layer l, the residual stream
before layer l's MLP (the predictor's input) and layer l+1's exact queries and keys. At
sampled query positions t (the last row of a page, so every page up to t is complete):
- target: layer l+1's attention of the exact query over the keys up to t, softmax per query
  head, summed over each GQA group, on the token grid, then max-pooled onto the page grid and
  renormalised (the finer grid keeps a page with one sharp key from being averaged away);
- prediction: Quest scores of the Forecast query against each page's min/max keys, summed
  over the group, softmax over the pages;
- loss: KL(target || prediction). The sinks and the local window are left out of both: the
  selector always takes them.
`--target selector` (the default) uses the exact selector's own scores instead (their
softmax at unit spread): the engine's recall is measured against that selector, and on the
default model training on the attention target *lowered* held-out recall (0.93 -> 0.80 at
10%: attention mass and Quest's upper bound rank pages differently), while the selector
target raises it (0.931 -> 0.941). See docs/quality.md.
Evaluation: recall@k of the predicted pages against the exact selector's pages (Quest scores
of the exact query), sinks and window included as the engine counts them, at budgets of 2%,
5% and 10% of the pages, per layer and averaged, for the training-free predictor (B = 0) and
the trained one, on the held-out documents.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.kv.forecast import TrainingFreeForecast, low_rank_correction, save_weights

P = 16  # page size (the engine's)
SINKS, WINDOW = 1, 2
BOOKS = Path(__file__).resolve().parents[3] / "shared" / "data" / "books"


# -- data ------------------------------------------------------------------------------------


def held_out(name: str) -> bool:
    return int(hashlib.md5(name.encode()).hexdigest(), 16) % 5 == 0


def documents(tokenizer, n_tokens: int, limit: int, evaluation: bool,
              books_dir: Path = BOOKS) -> list[list[int]]:  # fmt: skip
    """Documents of n_tokens tokens: stdlib sources (joined file by file), then book chunks."""
    stdlib = Path(sys.modules["os"].__file__).parent
    files = sorted(p for p in stdlib.glob("*.py") if held_out(p.name) == evaluation)
    random.Random(0).shuffle(files)
    books = sorted(books_dir.glob("*.txt")) if books_dir.is_dir() else []
    code_docs = limit - limit // 2 if books else limit  # half code, half prose
    docs, buf = [], []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        buf += tokenizer.encode(f"# {path.name}\n{text}\n", add_special_tokens=False)
        while len(buf) >= n_tokens and len(docs) < code_docs:
            docs.append(buf[:n_tokens])
            buf = buf[n_tokens:]
    for i, book in enumerate(books):
        ids = tokenizer.encode(book.read_text(encoding="utf-8"), add_special_tokens=False)
        chunks = [ids[i : i + n_tokens] for i in range(0, len(ids) - n_tokens, n_tokens)]
        chunks = [c for j, c in enumerate(chunks) if held_out(f"{book.name}:{j}") == evaluation]
        room = limit - len(docs)
        docs += chunks[: -(-room // (len(books) - i))]  # an even share of what is left
    return docs[:limit]


@torch.no_grad()
def trace(model, rope, ids: list[int], positions: list[int]) -> dict:
    """One dense causal forward pass; per layer the normed predictor input of the next layer
    at `positions`, the training-free query there, and the exact query there and all keys."""
    T = len(ids)
    cos, sin = rope(torch.arange(T))
    pos = torch.tensor(positions)
    x, residual = model.embed_tokens(torch.tensor(ids)), None
    out = {"mid": [], "q": [], "k": []}
    for layer in model.layers:
        if residual is None:
            h, residual = layer.input_layernorm.forward(x), x
        else:
            h, residual = layer.input_layernorm.forward(x, residual)
        attn = layer.self_attn
        q, k, v = attn.rotated_qkv(h, cos, sin)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            is_causal=True, scale=attn.scale, enable_gqa=True,
        )[0].transpose(0, 1)  # fmt: skip
        h = attn.o_proj.forward(o.reshape(T, attn.q_size))
        h, residual = layer.post_attention_layernorm.forward(h, residual)
        out["mid"].append(residual[pos].clone())
        out["q"].append(q[pos].clone())
        out["k"].append(k.clone())
        x = layer.mlp.forward(h)
    out["cos"], out["sin"] = cos[pos], sin[pos]
    return out


def quest_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, groups: int):
    """q [S, Hq, D]; kmin/kmax [Hkv, N, D] -> [S, Hkv, N] (summed over each group)."""
    S, Hq, D = q.shape
    qg = q.view(S, Hq // groups, groups, D)
    s = torch.einsum("shgd,hnd->shgn", qg.clamp(min=0), kmax) + torch.einsum(
        "shgd,hnd->shgn", qg.clamp(max=0), kmin
    )
    return s.sum(2)


def build_examples(model, rope, docs, samples: int, seed: int, target: str) -> list[dict]:
    """Per document and layer pair (l -> l+1): predictor inputs, training-free queries,
    targets, page summaries, exact selector scores and masks."""
    rng = random.Random(seed)
    free_forecast = TrainingFreeForecast(model)
    attn0 = model.layers[0].self_attn
    groups = attn0.num_heads // attn0.num_kv_heads
    examples = []
    for ids in docs:
        n_pages = len(ids) // P
        lo = max(SINKS + WINDOW + 8, n_pages // 4)
        positions = sorted(rng.sample(range(lo, n_pages), min(samples, n_pages - lo)))
        positions = [(p + 1) * P - 1 for p in positions]  # the last row of a page
        tr = trace(model, rope, ids, positions)
        t = torch.tensor(positions)
        n_valid = (t + 1) // P  # pages up to and including t's
        N = n_pages
        page = torch.arange(N)
        valid = page[None, :] < n_valid[:, None]  # [S, N]
        forced = (page[None, :] < SINKS) | (page[None, :] >= n_valid[:, None] - WINDOW)
        free = valid & ~forced
        for nxt in range(1, len(model.layers)):
            attn = model.layers[nxt].self_attn
            with torch.no_grad():
                n = free_forecast.normed(nxt, tr["mid"][nxt - 1])
                q_free = free_forecast.query_from(nxt, n, tr["cos"], tr["sin"])
                k = tr["k"][nxt][: N * P]  # [T, Hkv, D]
                kp = k.view(N, P, attn.num_kv_heads, attn.head_dim).permute(2, 0, 1, 3)
                kmin, kmax = kp.amin(2), kp.amax(2)  # [Hkv, N, D]
                q_true = tr["q"][nxt]
                logits = torch.einsum("shd,khd->shk", q_true, k.repeat_interleave(groups, 1))
                logits = logits * attn.scale
                causal = torch.arange(N * P)[None, :] <= t[:, None]
                logits = logits.masked_fill(~causal[:, None, :], float("-inf"))
                probs = logits.softmax(-1).view(len(positions), -1, groups, N * P).sum(2)
                goal = probs.view(len(positions), -1, N, P).amax(-1)  # [S, Hkv, N]
                goal = goal * free[:, None, :]
                goal = goal / goal.sum(-1, keepdim=True).clamp(min=1e-12)
                exact = quest_scores(q_true, kmin, kmax, groups)
                if target == "selector":  # the exact selector's scores, at unit spread
                    free3 = free[:, None, :].expand_as(exact)
                    z = exact / exact[free3].std().clamp(min=1e-6)
                    goal = z.masked_fill(~free3, float("-inf")).softmax(-1)
            examples.append({
                "layer": nxt, "n": n.float(), "q_free": q_free.float(), "cos": tr["cos"],
                "sin": tr["sin"], "kmin": kmin, "kmax": kmax, "target": goal, "exact": exact,
                "valid": valid, "forced": forced, "free": free, "groups": groups,
            })  # fmt: skip
    return examples


# -- model ------------------------------------------------------------------------------------


def predicted_scores(ex: dict, weights: dict | None) -> torch.Tensor:
    q = ex["q_free"]
    if weights is not None and ex["layer"] in weights:
        q = q + low_rank_correction(ex["n"], *weights[ex["layer"]], ex["cos"], ex["sin"], q.shape)
    return quest_scores(q, ex["kmin"], ex["kmax"], ex["groups"])


def kl_loss(ex: dict, weights: dict, scales: dict | None = None) -> torch.Tensor:
    """KL(target || softmax over the free pages of the scores x exp(scale)): the learnt
    per-layer scale only matches the softmax's sharpness to the target's; the page ranking,
    all the engine uses, does not depend on it."""
    s = predicted_scores(ex, weights)
    if scales is not None:
        s = s * scales[ex["layer"]].exp()
    free = ex["free"][:, None, :].expand_as(s)
    logp = s.masked_fill(~free, float("-inf")).log_softmax(-1)
    tgt = ex["target"]
    term = torch.where(tgt > 0, tgt * (tgt.clamp(min=1e-12).log() - logp), torch.zeros_like(tgt))
    return term.sum(-1).mean()


def recall(ex: dict, weights: dict | None, frac: float) -> tuple[float, float]:
    """(hits, total) of the predicted selection against the exact one, sinks and window
    included (they are always in both), at a budget of `frac` of each position's pages."""
    with torch.no_grad():
        pred, exact = predicted_scores(ex, weights), ex["exact"]
    hits = total = 0.0
    n_valid = ex["valid"].sum(-1)
    for i in range(pred.shape[0]):
        n = int(n_valid[i])
        budget = max(SINKS + WINDOW + 1, math.ceil(frac * n))
        k = budget - SINKS - WINDOW
        free = ex["free"][i]
        for h in range(pred.shape[1]):
            p = pred[i, h].masked_fill(~free, float("-inf")).topk(k).indices
            e = exact[i, h].masked_fill(~free, float("-inf")).topk(k).indices
            hits += len(set(p.tolist()) & set(e.tolist())) + SINKS + WINDOW
            total += budget
    return hits, total


def evaluate(examples, weights, fracs=(0.02, 0.05, 0.10)) -> dict:
    out = {}
    for frac in fracs:
        by_layer: dict[int, list[float]] = {}
        for ex in examples:
            h, t = recall(ex, weights, frac)
            acc = by_layer.setdefault(ex["layer"], [0.0, 0.0])
            acc[0] += h
            acc[1] += t
        per = {layer: h / t for layer, (h, t) in sorted(by_layer.items())}
        out[f"{frac:.0%}"] = {"mean": sum(per.values()) / len(per), "by_layer": per}
    return out


def mean_loss(examples, weights, scales) -> float:
    with torch.no_grad():
        return sum(float(kl_loss(ex, weights, scales)) for ex in examples) / len(examples)


# -- a PNG line plot without plotting libraries ------------------------------------------------


def plot_png(path: Path, series: dict[str, list[float]], title: str) -> None:
    import struct
    import zlib

    W, H, M = 640, 360, 40
    img = [[(255, 255, 255)] * W for _ in range(H)]
    colors = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189)]
    values = [v for s in series.values() for v in s]
    lo, hi = min(values), max(values)
    hi = hi if hi > lo else lo + 1

    def xy(i, n, v):
        x = M + int((W - 2 * M) * i / max(1, n - 1))
        y = H - M - int((H - 2 * M) * (v - lo) / (hi - lo))
        return x, y

    for x in range(M, W - M):
        img[H - M][x] = (0, 0, 0)
    for y in range(M, H - M + 1):
        img[y][M] = (0, 0, 0)
    for c, (_name, s) in zip(colors, series.items(), strict=False):
        pts = [xy(i, len(s), v) for i, v in enumerate(s)]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            steps = max(abs(x1 - x0), abs(y1 - y0), 1)
            for j in range(steps + 1):
                x, y = x0 + (x1 - x0) * j // steps, y0 + (y1 - y0) * j // steps
                for dy in (0, 1):
                    if 0 <= y + dy < H:
                        img[y + dy][x] = c
    raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in img)

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))
    png += chunk(b"tEXt", b"Title\x00" + title.encode("latin-1", "replace"))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    path.write_bytes(png)


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    from engine import Engine
    from engine.kv.forecast import model_key

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="default: the default model")
    ap.add_argument("--docs", type=int, default=48, help="training documents")
    ap.add_argument("--eval-docs", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=24, help="query positions per document")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--target", choices=["attention", "selector"], default="selector",
                    help="attention: layer l+1's attention mass, max-pooled from the token grid "
                    "onto pages (the paper's); selector: the exact Quest scores' softmax")  # fmt: skip
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--device", default="cpu", help="cpu or cuda: the model and the training")
    ap.add_argument("--books", default=str(BOOKS), help="a folder of .txt books (the prose half)")
    ap.add_argument("--out", default=None, help="default: the package's forecast_weights/")
    ap.add_argument("--plot", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    engine = Engine.load(args.model, device=args.device, dtype="float32", weights="dense")
    torch.set_default_device(engine.device)  # the traces, examples and weights beside the model
    model, rope = engine.model, engine.runner.rope
    t0 = time.perf_counter()
    books = Path(args.books)
    train_docs = documents(engine.tokenizer, args.tokens, args.docs, False, books)
    eval_docs = documents(engine.tokenizer, args.tokens, args.eval_docs, True, books)
    train = build_examples(model, rope, train_docs, args.samples, seed=1, target=args.target)
    held = build_examples(model, rope, eval_docs, args.samples, seed=2, target=args.target)
    print(f"{len(train_docs)} training and {len(eval_docs)} held-out documents of "
          f"{args.tokens} tokens; traced in {time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    cfg = model.cfg
    weights = {}
    for layer in range(1, cfg.num_layers):
        a = (torch.randn(args.rank, cfg.hidden_size) / math.sqrt(cfg.hidden_size)).requires_grad_()
        b = torch.zeros(cfg.num_heads * cfg.head_dim, args.rank, requires_grad=True)
        weights[layer] = (a, b)
    params = [t for ab in weights.values() for t in ab]
    n_params = sum(t.numel() for t in params)
    # per-layer softmax sharpness, started where the training-free scores have unit spread
    scales = {}
    for layer in weights:
        spread = [predicted_scores(ex, None)[ex["free"][:, None, :].expand(-1, len(ex["kmin"]), -1)]
                  .std() for ex in train if ex["layer"] == layer]  # fmt: skip
        scales[layer] = (-torch.stack(spread).mean().clamp(min=1e-6).log()).requires_grad_()
    n_model = sum(t.numel() for t in model.parameters())
    print(f"Forecast parameters: {n_params:,} ({n_params / n_model:.2%} of the model's)")
    opt = torch.optim.Adam(params + list(scales.values()), lr=args.lr)
    curve = {"train": [], "held-out": []}
    rng = random.Random(3)
    by_doc = len(train) // max(1, len(train_docs))
    for step in range(args.steps + 1):
        if step % 20 == 0:
            curve["train"].append(mean_loss(train[: 8 * by_doc], weights, scales))
            curve["held-out"].append(mean_loss(held, weights, scales))
            print(f"step {step:4d}  KL train {curve['train'][-1]:.4f}  held-out "
                  f"{curve['held-out'][-1]:.4f}", flush=True)  # fmt: skip
        if step == args.steps:
            break
        batch = rng.sample(train, min(len(train), 32))
        loss = sum(kl_loss(ex, weights, scales) for ex in batch) / len(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    free = evaluate(held, None)
    trained = evaluate(held, weights)
    for frac in free:
        print(f"held-out recall@{frac}: training-free {free[frac]['mean']:.3f}, trained "
              f"{trained[frac]['mean']:.3f}")  # fmt: skip
    out = Path(args.out) if args.out else (
        Path(__file__).parent / "forecast_weights" / f"{model_key(model)}.safetensors"
    )  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    save_weights(out, model, weights, meta={"rank": str(args.rank), "steps": str(args.steps),
                                            "model": engine.name})  # fmt: skip
    print(f"saved {out} ({out.stat().st_size / 1024:.0f} KiB)")
    if args.plot:
        plot_png(Path(args.plot), curve, "Forecast training: KL (train, held-out) every 20 steps")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "params": n_params, "params_fraction": n_params / n_model,
            "curve": curve, "recall_training_free": free, "recall_trained": trained,
        }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
