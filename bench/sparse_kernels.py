"""Sparse attention and tier kernels on the GPU: correctness at real shapes, then speed.

python3 -m bench.sparse_kernels [--contexts 32768 131072 500000] [--json out.json]

1. Correctness: the sparse decode, page scoring, gather and append kernels against their
   torch references at the Llama-3.1-8B head layout (32 query heads, 8 KV heads, dim 128,
   bf16, pages of 16 tokens).
2. Sparse decode attention for one layer, batch 1 and 8, budgets 2% and 0.2% of the pages:
   the kernel alone; scoring + selection + kernel; a torch gather of the selected pages then
   SDPA; dense SDPA over the whole contiguous context. Every variant is captured in a CUDA
   graph and replayed, so the times are device times without Python launch overhead;
   medians of CUDA-event timings.
3. Page gather from pinned host memory (4 KB and 8 KB pages): the UVA kernel at several
   program counts and the copy-engine path, against one large pinned cudaMemcpy (the
   ceiling); and the fraction of a UVA gather hidden beside an HBM-bound copy.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from engine.kv.select_methods import SelectMethods
from kernels.page_score import PageSummaries

HQ, HKV, D, P = 32, 8, 128, 16
DT = torch.bfloat16


def graph_time(fn, iters: int = 50, reps: int = 5) -> float:
    """Median ms of one call of fn, replayed from a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return event_time(g.replay, iters, reps)


def event_time(fn, iters: int = 50, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / iters)
    return statistics.median(times)


def random_lists(B: int, n_pages: int, k: int, g: torch.Generator):
    """Per (sequence, head): k distinct pages, the last one always, ascending."""
    pages = torch.empty(B, HKV, k, dtype=torch.int32)
    for b in range(B):
        for h in range(HKV):
            pick = torch.randperm(n_pages - 1, generator=g)[: k - 1]
            pages[b, h] = torch.sort(torch.cat([pick, torch.tensor([n_pages - 1])])).values
    return pages


def select(scores, lens, budget: int, methods, use_triton: bool | None = None):
    """The engine's selection of `budget` pages (a fixed width), by the method `methods`
    picks for the shape (engine.kv.select_methods)."""
    from kernels.page_topk import select_pages
    from kernels.views import SelectRule

    rule = SelectRule(P, budget, width=budget)
    return select_pages(scores, lens, rule, method=methods.method_for(scores, lens, rule),
                        use_triton=use_triton)  # fmt: skip


def check_correctness(rows: list) -> None:
    from kernels.kv_append import append_kv, append_kv_reference
    from kernels.page_score import empty_summaries, page_scores, page_scores_reference
    from kernels.sparse_decode import sparse_decode_attention, sparse_decode_reference
    from kernels.uva_gather import gather_pages, gather_reference
    from kernels.views import PageList, PageTable, RowPlaces

    g = torch.Generator().manual_seed(0)
    B, N = 2, 32768
    n_pages = N // P
    units = B * HKV * n_pages
    kv = torch.randn(units, 2, P, D, generator=g).to(DT).cuda()
    lens = torch.tensor([N, N - 5], dtype=torch.int32).cuda()
    for T in (1, 4):
        q = torch.randn(B, T, HQ, D, generator=g).to(DT).cuda()
        pages = random_lists(B, n_pages, 160, g).cuda()
        base = (torch.arange(B)[:, None, None] * HKV + torch.arange(HKV)[None, :, None]) * n_pages
        u = (base.cuda() + pages).to(torch.int32)
        counts = torch.full((B, HKV), 160, dtype=torch.int32).cuda()
        out = sparse_decode_attention(q, kv, PageList(u, pages, counts), lens, D**-0.5)
        ref = sparse_decode_reference(q, kv, PageList(u, pages, counts), lens, D**-0.5)
        err = (out.float() - ref.float()).abs().max().item()
        rows.append((f"sparse decode kernel vs reference, 32K, T={T}", err, err < 2e-2))
    summ = torch.randn(units, 3, D, generator=g).cuda()
    summ[:, 0], summ[:, 1] = summ[:, :2].amin(1), summ[:, :2].amax(1)
    tables = (torch.arange(B)[:, None] * n_pages + torch.arange(n_pages)[None, :]).to(torch.int32)
    q = torch.randn(B, 1, HQ, D, generator=g).to(DT).cuda()
    table = PageTable(tables.cuda(), lens, P)
    for mode in ("quest", "mean"):
        a = page_scores(q, PageSummaries(summ, HKV, mode), table)
        r = page_scores_reference(q, PageSummaries(summ, HKV, mode), table)
        fin = torch.isfinite(r)
        err = ((a - r).abs()[fin] / r.abs()[fin].clamp(min=1)).max().item()
        rows.append((f"page scores ({mode}, TF32) vs reference, 32K", err, err < 1e-2))
    small = summ[:, :2].to(DT)  # the engine's Quest layout: min/max in the keys' dtype
    a = page_scores(q, PageSummaries(small, HKV), table)
    r = page_scores_reference(q, PageSummaries(small.float(), HKV), table)
    fin = torch.isfinite(r)
    err = ((a - r).abs()[fin] / r.abs()[fin].clamp(min=1)).max().item()
    rows.append(("page scores (quest, bf16 min/max) vs reference, 32K", err, err < 1e-2))
    methods = SelectMethods()
    for budget in (41, 164):
        got = select(a, lens, budget, methods, use_triton=True)
        ref = select(a, lens, budget, methods, use_triton=False)
        same = all(torch.equal(x, y) for x, y in zip(got, ref, strict=True))
        rows.append((f"top-k selection kernel vs topk + sort, 32K, {budget} pages", 0.0, same))
    host = torch.randn(4096, 2, P, D, generator=g).to(DT).pin_memory()
    dst, ref = (
        torch.zeros(512, 2, P, D, dtype=DT).cuda(),
        torch.zeros(512, 2, P, D, dtype=DT).cuda(),
    )
    si = torch.randperm(4096, generator=g)[:300].to(torch.int32)
    di = torch.randperm(512, generator=g)[:300].to(torch.int32)
    gather_pages(host, dst, si.cuda(), di.cuda())
    gather_reference(host, ref, si, di)
    torch.cuda.synchronize()
    rows.append(("UVA gather from pinned host vs reference", 0.0, torch.equal(dst, ref)))
    n = 64
    k, v = torch.randn(n, HKV, D, generator=g).to(DT).cuda(), torch.randn(n, HKV, D).to(DT).cuda()
    pg = torch.randint(0, 64, (n,), generator=g).to(torch.int32).cuda()
    off = torch.randint(0, P, (n,), generator=g).to(torch.int32).cuda()
    slots = torch.randint(-1, 32, (n, HKV), generator=g).to(torch.int32).cuda()
    results = []
    for fn in (append_kv, append_kv_reference):
        h = torch.zeros(64 * HKV, 2, P, D, dtype=DT).pin_memory()
        gp = torch.zeros(32, 2, P, D, dtype=DT).cuda()
        sm = empty_summaries(64 * HKV, D, "cuda")
        fn(k, v, h, gp, RowPlaces(pg, off), slots, sm)
        torch.cuda.synchronize()
        results.append((h, gp, sm))
    # rows that land on the same (page, offset) leave one of them: compare where unique
    ok = torch.allclose(results[0][2], results[1][2], atol=1e-2)
    rows.append(("append (host via UVA, slots, summaries) vs reference: summaries", 0.0, ok))


def attention_speed(contexts, rows: list) -> None:
    from kernels.page_score import page_scores
    from kernels.sparse_decode import sparse_decode_attention
    from kernels.views import PageList, PageTable

    methods = SelectMethods()  # the engine's choice of top-k method, timed per shape

    g = torch.Generator().manual_seed(1)
    for N in contexts:
        n_pages = -(-N // P)
        for B in (1, 8):
            units = B * HKV * n_pages
            try:
                kv = torch.empty(units, 2, P, D, dtype=DT, device="cuda").normal_()
            except torch.OutOfMemoryError:
                rows.append({"context": N, "batch": B, "skipped": "out of memory"})
                continue
            kd = kv.view(B, HKV, n_pages, 2, P, D)
            k_dense = kd[:, :, :, 0].reshape(B, HKV, n_pages * P, D)[:, :, :N]
            v_dense = kd[:, :, :, 1].reshape(B, HKV, n_pages * P, D)[:, :, :N]
            q = torch.randn(B, 1, HQ, D, device="cuda", dtype=DT)
            lens = torch.full((B,), N, dtype=torch.int32, device="cuda")
            qd = q.transpose(1, 2)  # [B, Hq, 1, D]

            def dense():
                torch.nn.functional.scaled_dot_product_attention(
                    qd, k_dense, v_dense, enable_gqa=True
                )

            t_dense = graph_time(dense)
            # the engine's layouts: Quest's min/max in the keys' dtype, mean's fp32 sum
            summs = {"quest": torch.randn(units, 2, D, device="cuda", dtype=DT),
                     "mean": torch.randn(units, 1, D, device="cuda")}  # fmt: skip
            tables = (
                (torch.arange(B)[:, None] * n_pages + torch.arange(n_pages)[None, :])
                .to(torch.int32)
                .cuda()
            )
            table = PageTable(tables, lens, P)
            for frac in (0.02, 0.002):
                k = max(4, round(frac * n_pages))
                pages = random_lists(B, n_pages, k, g).cuda()
                base = torch.arange(B)[:, None, None] * HKV + torch.arange(HKV)[None, :, None]
                base = base.cuda() * n_pages
                u = (base + pages).to(torch.int32)
                counts = torch.full((B, HKV), k, dtype=torch.int32, device="cuda")

                def kernel():
                    sparse_decode_attention(q, kv, PageList(u, pages, counts), lens, D**-0.5)

                def selected(mode="quest", layers=1):
                    """Score every page, select, then the kernel for `layers` layers that
                    share the selection."""
                    s = page_scores(q, PageSummaries(summs[mode], HKV, mode), table)
                    pg, cn = select(s, lens, k, methods)
                    uu = (base + pg).to(torch.int32)
                    for _ in range(layers):
                        sparse_decode_attention(q, kv, PageList(uu, pg, cn), lens, D**-0.5)

                flat = kv.view(B * HKV, n_pages, 2, P, D)
                sel = pages.view(B * HKV, k).long()
                row = torch.arange(B * HKV, device="cuda")[:, None]
                qg = q.view(B, HQ, D).view(B * HKV, HQ // HKV, 1, D)

                def torch_gather():
                    pk = flat[row, sel]  # [B * Hkv, k, 2, P, D]
                    kk = pk[:, :, 0].reshape(B * HKV, 1, k * P, D)
                    vv = pk[:, :, 1].reshape(B * HKV, 1, k * P, D)
                    torch.nn.functional.scaled_dot_product_attention(qg, kk, vv, enable_gqa=True)

                def scoring(block=16, mode="quest"):
                    page_scores(q, PageSummaries(summs[mode], HKV, mode), table, block=block)

                if frac == 0.02:
                    for mode in ("quest", "mean"):
                        for blk in (16, 32, 64, 128):
                            t = graph_time(lambda blk=blk, mode=mode: scoring(blk, mode))
                            print(json.dumps({"context": N, "batch": B, "scoring": mode,
                                              "block": blk, "ms": t}), flush=True)  # fmt: skip

                scores = page_scores(q, PageSummaries(summs["quest"], HKV), table)

                def selection(use_triton=True):
                    select(scores, lens, k, methods, use_triton=use_triton)

                t_kernel = graph_time(kernel)
                t_sel = graph_time(selected)
                t_shared4 = graph_time(lambda: selected(layers=4)) / 4  # one selection, 4 layers
                t_mean_sel = graph_time(lambda: selected("mean"))
                t_score, t_select = graph_time(scoring), graph_time(selection)
                t_select_torch = graph_time(lambda: selection(False))
                t_gather = graph_time(torch_gather)
                rows.append({
                    "context": N, "batch": B, "budget": frac, "pages": k,
                    "dense_ms": t_dense, "kernel_ms": t_kernel, "with_selection_ms": t_sel,
                    "torch_gather_sdpa_ms": t_gather, "scoring_ms": t_score,
                    "with_mean_selection_ms": t_mean_sel,
                    "x_dense_mean_selection": t_dense / t_mean_sel,
                    "selection_shared_by_4_layers_ms_per_layer": t_shared4,
                    "x_dense_shared4": t_dense / t_shared4,
                    "topk_selection_ms": t_select, "topk_selection_torch_ms": t_select_torch,
                    "x_dense_kernel": t_dense / t_kernel, "x_dense_selection": t_dense / t_sel,
                    "x_torch_gather": t_gather / t_kernel,
                })  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
            kv = kd = k_dense = v_dense = summs = None  # free before the next size
            torch.cuda.empty_cache()


def gather_speed(rows: list) -> None:
    from kernels.uva_gather import gather_copy_engine, gather_pages
    from kernels.views import GatherLaunch

    g = torch.Generator().manual_seed(2)
    big = torch.empty(1 << 28, dtype=torch.uint8).pin_memory()
    dev = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    t = event_time(lambda: dev.copy_(big, non_blocking=True), iters=5)
    ceiling = (1 << 28) / t / 1e6
    rows.append({"what": "cudaMemcpy pinned->device, 256 MiB", "GB/s": ceiling})
    print(json.dumps(rows[-1]), flush=True)
    for d in (64, 128):
        page_bytes = 2 * P * d * 2
        n_host = (4 << 30) // page_bytes
        host = torch.empty(n_host, 2, P, d, dtype=DT).pin_memory()
        n = (64 << 20) // page_bytes  # 64 MiB of pages per gather
        slots = torch.empty(n, 2, P, d, dtype=DT, device="cuda")
        si = torch.randperm(n_host, generator=g)[:n].to(torch.int32)
        di = torch.arange(n, dtype=torch.int32)
        sic, dic = si.cuda(), di.cuda()
        best = (0.0, 0)
        for progs in (8, 16, 32, 66, 132, 264):
            t = event_time(lambda p=progs: gather_pages(host, slots, sic, dic, GatherLaunch(p)), 5)
            gbs = n * page_bytes / t / 1e6
            rows.append({"what": f"UVA gather {page_bytes // 1024} KB pages", "programs": progs,
                         "GB/s": gbs, "x_ceiling": gbs / ceiling})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            best = max(best, (gbs, progs))
        staging = torch.empty(n, 2, P, d, dtype=DT).pin_memory()
        t = event_time(lambda: gather_copy_engine(host, slots, si, dic, staging), 3)
        rows.append({"what": f"copy-engine gather {page_bytes // 1024} KB pages",
                     "GB/s": n * page_bytes / t / 1e6})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
        # hidden fraction: the gather on a side stream beside an HBM-bound copy
        a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        b = torch.empty_like(a)
        side = torch.cuda.Stream()

        def hbm():
            for _ in range(8):
                b.copy_(a)

        t_hbm = event_time(hbm, 3)
        for progs in (8, 16, 32, 66):

            def gather(p=progs):
                gather_pages(host, slots, sic, dic, GatherLaunch(p))

            t_g = event_time(gather, 3)

            def both(gather=gather):
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    gather()
                hbm()
                torch.cuda.current_stream().wait_stream(side)

            t_both = event_time(both, 3)
            hidden = max(0.0, min(1.0, (t_hbm + t_g - t_both) / t_g))
            rows.append({"what": f"UVA gather {page_bytes // 1024} KB pages ({progs} programs) "
                         "beside an HBM-bound copy", "gather_ms": t_g, "hbm_ms": t_hbm,
                         "both_ms": t_both, "hidden_fraction": hidden,
                         "gather_GB/s_alone": n * page_bytes / t_g / 1e6})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        host = slots = staging = a = b = None  # free before the next page size
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072, 500000])
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip", nargs="*", default=[], help="correctness, attention, gather")
    args = ap.parse_args()
    checks, attn, gath = [], [], []
    if "correctness" not in args.skip:
        check_correctness(checks)
        for name, err, ok in checks:
            print(f"[{'ok' if ok else 'FAIL'}] {name}  max err {err:.2e}", flush=True)
    if "attention" not in args.skip:
        attention_speed(args.contexts, attn)
    if "gather" not in args.skip:
        gather_speed(gath)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'context':>8} {'B':>2} {'budget':>7} {'dense ms':>9} {'kernel ms':>10} {'x dense':>8}"
          f" {'+select ms':>11} {'x dense':>8} {'gather+SDPA ms':>15} {'x':>6}")  # fmt: skip
    for r in attn:
        if "skipped" in r:
            print(f"{r['context']:>8} {r['batch']:>2}  skipped: {r['skipped']}")
            continue
        print(f"{r['context']:>8} {r['batch']:>2} {r['budget']:>7.1%} {r['dense_ms']:>9.4f}"
              f" {r['kernel_ms']:>10.4f} {r['x_dense_kernel']:>7.1f}x {r['with_selection_ms']:>11.4f}"
              f" {r['x_dense_selection']:>7.1f}x {r['torch_gather_sdpa_ms']:>15.4f}"
              f" {r['x_torch_gather']:>5.1f}x")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "checks": checks, "attention": attn,
                       "gather": gath}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
