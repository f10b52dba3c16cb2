#!/usr/bin/env bash
# The next H200 session's runs for issues 5 and 6, in the order of their value; each line is
# one device call's worth (10 minutes at most), results under $OUT. Usage on the device:
#   bash bench/gpu_runbook.sh N    (27-31 ran in the fifth session of 2026-11-30: results in
#   docs/benchmarks.md; 31 is the current state of issue 7, 28 and 29 of issue 6; the next
#   session: 32; 32-35 ran in the sixth session of 2026-11-30; 36-43 in the seventh)
set -u
OUT=${OUT:-/tmp}
case "${1:-1}" in
1)  # graphs, Forecast prefetch on the side stream inside graphs, and 128K with prefetch modes
    python3 -m bench.gpu_sparse_check > "$OUT/check.log" 2>&1; tail -9 "$OUT/check.log"
    python3 -m bench.e2e_sparse --context 131072 --batch 1 --prefetch off forecast oracle \
        --json "$OUT/e2e_128k_b1_prefetch.json" > "$OUT/e2e_128k_b1.log" 2>&1
    tail -12 "$OUT/e2e_128k_b1.log" ;;
2)  # 500K batch 1 under the 24 GiB cap (a 1.5 GiB GPU tier: 6,144 slots per layer >= 5,000)
    python3 -m bench.e2e_sparse --context 500000 --batch 1 --gpu-kv-budget 1536MiB \
        --variants realistic worst --prefetch off forecast oracle \
        --json "$OUT/e2e_500k_b1.json" > "$OUT/e2e_500k.log" 2>&1
    tail -10 "$OUT/e2e_500k.log" ;;
3)  # 128K batch 4 (130,000 tokens each: a 63.5 GiB pinned pool)
    python3 -m bench.e2e_sparse --context 130000 --batch 4 --gpu-kv-budget 2GiB \
        --variants realistic worst --json "$OUT/e2e_128k_b4.json" > "$OUT/e2e_b4.log" 2>&1
    tail -6 "$OUT/e2e_b4.log" ;;
4)  # speculative verification cost (issue 7), top-k selection methods, 128K prefetch modes
    timeout 230 python3 -m bench.spec_verify --context 131072 --batches 1 8 \
        --json "$OUT/spec_verify.json" > "$OUT/spec_verify.log" 2>&1; tail -22 "$OUT/spec_verify.log"
    timeout 100 python3 -m bench.select_bench --json "$OUT/select.json" > "$OUT/select.log" 2>&1
    tail -26 "$OUT/select.log"
    timeout 240 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants realistic worst \
        --prefetch off forecast oracle --json "$OUT/e2e_128k_select.json" > "$OUT/e2e_128k.log" 2>&1
    tail -8 "$OUT/e2e_128k.log" ;;
5)  # next session first: correctness of this session's untested GPU paths (autotuned scoring,
    # bisection top-k with per-sequence budgets, graphs), then the kernel table again for the
    # "5x with selection at 128K" goal
    python3 -m pytest -q tests/kernels > "$OUT/kernels.log" 2>&1; tail -3 "$OUT/kernels.log"
    python3 -m bench.gpu_sparse_check > "$OUT/check.log" 2>&1; tail -9 "$OUT/check.log"
    python3 -m bench.sparse_kernels --contexts 32768 131072 500000 \
        --json "$OUT/sparse_kernels_gpu.json" > "$OUT/sparse_kernels.log" 2>&1
    tail -20 "$OUT/sparse_kernels.log" ;;
6)  # 500K batch 1 against transformers' offloaded cache in the same run (3 of its tokens:
    # each moves the whole ~61 GiB of KV; it runs in a child process so that its host
    # memory is back before our pool is taken); bigger prefill chunks (fewer host gathers)
    timeout 590 python3 -m bench.e2e_sparse --context 500000 --batch 1 --hf --hf-new-tokens 3 \
        --gpu-kv-budget 1536MiB --chunk 16384 --variants realistic worst \
        --json "$OUT/e2e_500k_peers.json" > "$OUT/e2e_500k_peers.log" 2>&1 || echo "FAILED: $?"
    tail -8 "$OUT/e2e_500k_peers.log" ;;
7)  # 4 x 128K against transformers' offloaded cache; verification cost with the one-pass
    # per-query scoring (issue 7); the scoring kernel's tests on the H200
    python3 -m pytest -q tests/kernels/test_page_score.py tests/kernels/test_tier_kernels.py 2>&1 | tail -2
    timeout 90 python3 -m bench.gpu_sparse_check > "$OUT/check.log" 2>&1 || echo "FAILED: $?"
    tail -9 "$OUT/check.log"
    timeout 300 python3 -m bench.e2e_sparse --context 130000 --batch 4 --gpu-kv-budget 2GiB \
        --variants realistic worst --hf --hf-new-tokens 3 --json "$OUT/e2e_128k_b4_peers.json" \
        > "$OUT/e2e_b4_peers.log" 2>&1 || echo "FAILED: $?"
    tail -6 "$OUT/e2e_b4_peers.log"
    for b in 8; do
        timeout 120 python3 -m bench.spec_verify --context 131072 --batches $b --ks 0 1 4 \
            --json "$OUT/spec_verify_b$b.json" > "$OUT/spec_verify_b$b.log" 2>&1 || echo "FAILED: $?"
        tail -8 "$OUT/spec_verify_b$b.log"
    done ;;
8)  # next session first: the 7-kernel slot allocator (kernels.tier_alloc, interpreter-tested
    # only; switched on here) against its reference and in the engine (graphs == eager), then
    # what it changes end to end (128K, prefetch modes: issue 6) and where time goes
    export AGENTCTX_TIER_ALLOC_KERNELS=1
    timeout 100 python3 -m pytest -q tests/kernels/test_tier_alloc.py tests/kernels/test_tier_kernels.py \
        > "$OUT/kernels.log" 2>&1; tail -3 "$OUT/kernels.log"
    timeout 120 python3 -m bench.gpu_sparse_check > "$OUT/check.log" 2>&1 || echo "FAILED: $?"
    tail -9 "$OUT/check.log"
    timeout 240 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants realistic worst \
        --prefetch off forecast oracle --json "$OUT/e2e_128k_prefetch.json" \
        > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -8 "$OUT/e2e_128k.log"
    timeout 150 python3 -m bench.profile_decode --context 131072 --variant realistic \
        --prefetch off forecast > "$OUT/profile.log" 2>&1 || echo "FAILED: $?"
    tail -12 "$OUT/profile.log" ;;
10) # the probe top-k kernels (tests, then all methods timed) and the prefetch that no longer
    # waits at the append (checks in graphs; 128K prefetch modes: issue 6)
    timeout 90 python3 -m pytest -q tests/kernels/test_page_score.py -k "select or extreme" \
        > "$OUT/select_tests.log" 2>&1; tail -2 "$OUT/select_tests.log"
    timeout 120 python3 -m bench.select_bench --json "$OUT/select.json" > "$OUT/select.log" 2>&1 \
        || echo "FAILED: $?"
    tail -32 "$OUT/select.log"
    timeout 170 python3 -m bench.gpu_sparse_check > "$OUT/check.log" 2>&1 || echo "FAILED: $?"
    tail -9 "$OUT/check.log"
    timeout 200 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants realistic worst \
        --prefetch off forecast oracle --json "$OUT/e2e_128k_prefetch.json" \
        > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -7 "$OUT/e2e_128k.log" ;;
11) # 500K, batch 1, prefetch modes under the 24 GiB cap (issue 6's other context)
    timeout 570 python3 -m bench.e2e_sparse --context 500000 --batch 1 --gpu-kv-budget 1536MiB \
        --chunk 16384 --variants realistic worst --prefetch off forecast oracle \
        --json "$OUT/e2e_500k_prefetch.json" > "$OUT/e2e_500k.log" 2>&1 || echo "FAILED: $?"
    tail -7 "$OUT/e2e_500k.log" ;;
12) # where a decode step's time goes now (decode only), and batch-8 verification (issue 7)
    timeout 150 python3 -m bench.profile_decode --context 131072 --variant worst \
        --prefetch off forecast > "$OUT/profile.log" 2>&1 || echo "FAILED: $?"
    tail -3 "$OUT/profile.log"
    timeout 220 python3 -m bench.spec_verify --context 131072 --batches 8 --ks 0 4 \
        --gpu-kv-budget 6GiB --graphs --json "$OUT/spec_verify_b8.json" \
        > "$OUT/spec_verify_b8.log" 2>&1 || echo "FAILED: $?"
    tail -4 "$OUT/spec_verify_b8.log"
    timeout 150 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 4 \
        --gpu-kv-budget 5GiB --graphs --json "$OUT/spec_verify_b1.json" \
        > "$OUT/spec_verify_b1.log" 2>&1 || echo "FAILED: $?"
    tail -4 "$OUT/spec_verify_b1.log" ;;
13) # the probe top-k kernels after their compile fix (tests, timed against bisection and
    # radix), then where a 128K worst-case decode step's time goes, with and without prefetch
    timeout 60 python3 -m pytest -q tests/kernels/test_page_score.py -k "select or extreme" \
        > "$OUT/select_tests.log" 2>&1; tail -2 "$OUT/select_tests.log"
    timeout 70 python3 -m bench.select_bench --contexts 131072 500000 --budgets 0.02 \
        --methods radix bisect probe1 probe2 probe4 --json "$OUT/select.json" \
        > "$OUT/select.log" 2>&1 || echo "FAILED: $?"
    tail -11 "$OUT/select.log"
    timeout 130 python3 -m bench.profile_decode --context 131072 --variant worst \
        --prefetch off forecast > "$OUT/profile.log" 2>&1 || echo "FAILED: $?"
    tail -3 "$OUT/profile.log" ;;
14) # next session first: the staged prefetch (engine/kv/tiers.py: the side stream copies
    # predicted pages into a stage; the step waits only at its own fetch), the gather on
    # half the SMs, int32 slot values and the probe top-k's row tail, none run on a GPU yet: the checks (graphs == eager == no prefetch),
    # the gather kernel tests, then 128K prefetch modes (issue 6), then the probe top-k with
    # a row tail and at 500K
    timeout 60 python3 -m pytest -q tests/kernels/test_tier_kernels.py tests/kernels/test_tier_alloc.py \
        > "$OUT/kernels.log" 2>&1; tail -2 "$OUT/kernels.log"
    timeout 170 python3 -m bench.gpu_sparse_check > "$OUT/check.log" 2>&1 || echo "FAILED: $?"
    tail -9 "$OUT/check.log"
    timeout 200 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants realistic worst \
        --prefetch off forecast oracle --json "$OUT/e2e_128k_prefetch.json" \
        > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -7 "$OUT/e2e_128k.log"
    # (131,136 tokens: the e2e bench's 8,196-page rows, now a block and a tail)
    timeout 120 python3 -m bench.select_bench --contexts 131136 500000 --budgets 0.02 \
        --methods bisect probe1 probe2 radix --json "$OUT/select.json" > "$OUT/select.log" 2>&1 \
        || echo "FAILED: $?"
    tail -9 "$OUT/select.log" ;;
15) # then: 500K prefetch modes with the staged prefetch, the half-SM gather and the probe
    # top-k (rows past 16K pages), and where a worst-case step's time goes with prefetch
    timeout 450 python3 -m bench.e2e_sparse --context 500000 --batch 1 --gpu-kv-budget 1536MiB \
        --chunk 16384 --variants realistic worst --prefetch off forecast oracle \
        --json "$OUT/e2e_500k_prefetch.json" > "$OUT/e2e_500k.log" 2>&1 || echo "FAILED: $?"
    tail -7 "$OUT/e2e_500k.log"
    timeout 130 python3 -m bench.profile_decode --context 131072 --variant worst \
        --prefetch forecast > "$OUT/profile.log" 2>&1 || echo "FAILED: $?"
    tail -3 "$OUT/profile.log" ;;
17) # the gather with whole units in flight (rows per round trip) against programs, alone and
    # beside a layer's GEMVs; then 128K prefetch modes with the prefetch's gather on 16 or 66
    # programs, and the worst case's timeline (streams, overlap) with prefetch
    timeout 60 python3 -m pytest -q tests/kernels/test_tier_kernels.py tests/kernels/test_tier_alloc.py \
        > "$OUT/kernels.log" 2>&1; tail -2 "$OUT/kernels.log"
    timeout 90 python3 -m bench.gather_overlap --json "$OUT/gather_overlap.json" \
        > "$OUT/gather_overlap.log" 2>&1 || echo "FAILED: $?"
    tail -26 "$OUT/gather_overlap.log"
    timeout 230 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants worst realistic \
        --prefetch off forecast oracle --prefetch-programs 16 66 \
        --json "$OUT/e2e_128k_prefetch.json" > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -11 "$OUT/e2e_128k.log"
    timeout 150 python3 -m bench.profile_decode --context 131072 --variant worst \
        --prefetch off forecast --prefetch-programs 16 --json "$OUT/profile.json" \
        > "$OUT/profile.log" 2>&1 || echo "FAILED: $?"
    tail -30 "$OUT/profile.log" ;;
18) # the prefetch's staging in one kernel (kernels.uva_gather.stage_pages) and the gathers on
    # 16 programs by default: tests, the engine checks (graphs == eager == no prefetch), 128K
    # prefetch modes, and the worst case's timeline with the side stream's kernels
    timeout 60 python3 -m pytest -q tests/kernels/test_tier_kernels.py tests/kernels/test_tier_alloc.py \
        > "$OUT/kernels.log" 2>&1; tail -2 "$OUT/kernels.log"
    timeout 170 python3 -m bench.gpu_sparse_check > "$OUT/check.log" 2>&1 || echo "FAILED: $?"
    tail -9 "$OUT/check.log"
    timeout 150 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants worst realistic \
        --prefetch off forecast oracle --json "$OUT/e2e_128k_prefetch.json" \
        > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -7 "$OUT/e2e_128k.log"
    timeout 150 python3 -m bench.profile_decode --context 131072 --variant worst \
        --prefetch off forecast --json "$OUT/profile.json" \
        > "$OUT/profile.log" 2>&1 || echo "FAILED: $?"
    tail -30 "$OUT/profile.log" ;;
19) # 500K prefetch modes (context built with --skip-prefill-attention: seconds, not 258 s)
    # with the one-kernel staging, the 16-program gathers, the steadier
    # select-method pick and the 64-program gather of staged pages
    timeout 40 python3 -m pytest -q tests/kernels/test_tier_kernels.py > "$OUT/kernels.log" 2>&1
    tail -2 "$OUT/kernels.log"
    timeout 400 python3 -m bench.e2e_sparse --context 500000 --batch 1 --gpu-kv-budget 1536MiB \
        --chunk 16384 --variants worst realistic --prefetch off forecast auto oracle \
        --skip-prefill-attention \
        --json "$OUT/e2e_500k_prefetch.json" > "$OUT/e2e_500k.log" 2>&1 || echo "FAILED: $?"
    tail -7 "$OUT/e2e_500k.log" ;;
20) # 128K prefetch modes, with the residency snapshot (the prefetch staged only 30% of a 500K
    # worst case's pages in 19: it read slots the main stream was assigning beside it)
    timeout 170 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants worst realistic \
        --prefetch off forecast oracle --json "$OUT/e2e_128k_prefetch.json" \
        > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -7 "$OUT/e2e_128k.log" ;;
21) # next session first: the checks (now with the "auto" prefetch policy switching graphs),
    # then 128K prefetch modes with the policy and the prefetch stream at high priority
    # against normal; then 22, 19 (500K with the residency snapshot, not measured yet) and 16.
    # New since the last GPU run: the victims' histogram kernel (kernels.tier_alloc), the recall
    # kernel, the histogram top-k, the policy, the prefill shortcut: their tests first
    timeout 60 python3 -m pytest -q tests/kernels/test_tier_alloc.py tests/kernels/test_tier_kernels.py \
        > "$OUT/kernels.log" 2>&1; tail -2 "$OUT/kernels.log"
    timeout 170 python3 -m bench.gpu_sparse_check > "$OUT/check.log" 2>&1 || echo "FAILED: $?"
    tail -10 "$OUT/check.log"
    timeout 280 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants worst realistic \
        --prefetch off forecast auto oracle --prefetch-priority normal high --skip-prefill-attention \
        --json "$OUT/e2e_128k_priority.json" > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -15 "$OUT/e2e_128k.log" ;;
22) # the histogram top-k (4 byte-wide rounds) against the probe kernels, then the worst
    # case's timeline with the prefetch stream at high priority
    timeout 60 python3 -m pytest -q tests/kernels/test_page_score.py -k "select or extreme or ties or recall" \
        > "$OUT/select_tests.log" 2>&1; tail -2 "$OUT/select_tests.log"
    timeout 80 python3 -m bench.select_bench --contexts 131136 500000 --budgets 0.02 \
        --methods bisect probe2 hist radix --json "$OUT/select.json" > "$OUT/select.log" 2>&1 \
        || echo "FAILED: $?"
    tail -9 "$OUT/select.log"
    timeout 150 python3 -m bench.profile_decode --context 131072 --variant worst \
        --prefetch off forecast --prefetch-priority high --skip-prefill-attention --json "$OUT/profile.json" \
        > "$OUT/profile.log" 2>&1 || echo "FAILED: $?"
    tail -30 "$OUT/profile.log" ;;
24) # next session first: the victims' radix select over 1,024-slot programs (the one-program
    # kernel took 102 us per layer in runbook 22, twice torch.topk's), its tests on the GPU,
    # then 128K and 500K prefetch modes with it (500K with the residency snapshot: new too)
    timeout 60 python3 -m pytest -q tests/kernels/test_tier_alloc.py > "$OUT/kernels.log" 2>&1
    tail -2 "$OUT/kernels.log"
    timeout 170 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants worst realistic \
        --prefetch off forecast auto oracle --skip-prefill-attention \
        --json "$OUT/e2e_128k_prefetch.json" > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -9 "$OUT/e2e_128k.log"
    timeout 340 python3 -m bench.e2e_sparse --context 500000 --batch 1 --gpu-kv-budget 1536MiB \
        --chunk 16384 --variants worst realistic --prefetch off forecast auto oracle \
        --skip-prefill-attention \
        --json "$OUT/e2e_500k_prefetch.json" > "$OUT/e2e_500k.log" 2>&1 || echo "FAILED: $?"
    tail -9 "$OUT/e2e_500k.log" ;;
25) # batch-8 verification (k = 4 against one token, recurring selections) without and with
    # the Forecast prefetch (issue 7), then where a 500K realistic step's time goes with the
    # oracle prefetch, which lost to no prefetch there in runbook 24 (22.1 vs 24.6 tok/s worst,
    # 37.9 vs 51.6 realistic)
    for pf in off forecast; do
        timeout 170 python3 -m bench.spec_verify --context 131072 --batches 8 --ks 0 4 \
            --gpu-kv-budget 6GiB --graphs --recurring 0.86 --prefetch $pf --skip-prefill-attention \
            --json "$OUT/spec_verify_b8_$pf.json" > "$OUT/spec_verify_b8_$pf.log" 2>&1 \
            || echo "FAILED: $?"
        tail -4 "$OUT/spec_verify_b8_$pf.log"
    done
    timeout 200 python3 -m bench.profile_decode --context 500000 --gpu-kv-budget 1536MiB \
        --variant realistic --prefetch off oracle --skip-prefill-attention --json "$OUT/profile.json" \
        > "$OUT/profile.log" 2>&1 || echo "FAILED: $?"
    tail -40 "$OUT/profile.log" ;;
26) # the recall statistic in O(W1 + W2) (199 us per layer at 500K in runbook 25, on the
    # main stream: most of what the 500K prefetch lost), and the "timed" prefetch policy
    # (time steps both ways, keep the faster) against off / forecast / oracle, 128K and 500K
    timeout 60 python3 -m pytest -q tests/kernels/test_page_score.py -k recall > "$OUT/kernels.log" 2>&1
    tail -2 "$OUT/kernels.log"
    timeout 150 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants worst realistic \
        --prefetch off forecast timed oracle --skip-prefill-attention \
        --json "$OUT/e2e_128k_prefetch.json" > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -9 "$OUT/e2e_128k.log"
    timeout 330 python3 -m bench.e2e_sparse --context 500000 --batch 1 --gpu-kv-budget 1536MiB \
        --chunk 16384 --variants worst realistic --prefetch off forecast timed oracle \
        --skip-prefill-attention \
        --json "$OUT/e2e_500k_prefetch.json" > "$OUT/e2e_500k.log" 2>&1 || echo "FAILED: $?"
    tail -9 "$OUT/e2e_500k.log" ;;
28) # the "split" page selection (each row over programs of 1,024 pages; the one-program
    # select took 137 us per layer at 500K in runbook 25's profile, 46 us at 128K in 22):
    # correctness on the H200, the methods timed in CUDA graphs, then runbook 26's e2e
    # rows with whatever the engine now picks per shape (the logs end with the picks)
    timeout 90 python3 -m pytest -q tests/kernels/test_page_score.py -k "select" > "$OUT/kernels.log" 2>&1
    tail -2 "$OUT/kernels.log"
    timeout 90 python3 -m bench.select_bench --contexts 131072 500000 --budgets 0.02 \
        --methods hist probe2 split torch --json "$OUT/select.json" > "$OUT/select.log" 2>&1 || echo "FAILED: $?"
    tail -9 "$OUT/select.log"
    timeout 150 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants worst realistic \
        --prefetch off forecast timed oracle --skip-prefill-attention \
        --json "$OUT/e2e_128k_prefetch.json" > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -10 "$OUT/e2e_128k.log" ;;
29) # runbook 28's 500K rows (one call would run past 10 minutes)
    timeout 400 python3 -m bench.e2e_sparse --context 500000 --batch 1 --gpu-kv-budget 1536MiB \
        --chunk 16384 --variants worst realistic --prefetch off forecast timed oracle \
        --skip-prefill-attention \
        --json "$OUT/e2e_500k_prefetch.json" > "$OUT/e2e_500k.log" 2>&1 || echo "FAILED: $?"
    tail -10 "$OUT/e2e_500k.log" ;;
30) # the verification's per-query selection in fewer kernels (issue 7: runbook 27's profile
    # had a k >= 1 verification launch ~75 more kernels per layer than k = 0, +8 ms at batch
    # 1): the union in two Triton kernels (kernels/page_union.py), the synthetic draw in one
    # (kernels/synthetic_select.py), the query lengths and budgets once per step. First the
    # graphs' check (graph: the Triton union; eager: the torch one), then batch 1 profiled
    timeout 150 python3 -m bench.gpu_verify_check > "$OUT/verify_check.log" 2>&1 || echo "FAILED: $?"
    tail -6 "$OUT/verify_check.log"
    timeout 60 python3 -m pytest -q tests/kernels/test_page_union.py tests/kernels/test_synthetic_select.py \
        > "$OUT/kernels.log" 2>&1; tail -1 "$OUT/kernels.log"
    timeout 200 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 1 2 4 8 \
        --gpu-kv-budget 5GiB --graphs --recurring 0.86 --skip-prefill-attention --profile 25 \
        --json "$OUT/spec_verify_b1.json" > "$OUT/spec_verify_b1.log" 2>&1 || echo "FAILED: $?"
    tail -7 "$OUT/spec_verify_b1.log"
    timeout 200 python3 -m bench.spec_verify --context 131072 --batches 8 --ks 0 4 \
        --gpu-kv-budget 6GiB --graphs --recurring 0.86 --skip-prefill-attention \
        --json "$OUT/spec_verify_b8.json" > "$OUT/spec_verify_b8.log" 2>&1 || echo "FAILED: $?"
    tail -4 "$OUT/spec_verify_b8.log" ;;
31) # runbook 30 again with the synthetic draw over blocks of the row (it took 22 us per layer
    # on 40 programs) and the union's compaction in chunks of 4,096 pages; the graphs' check
    # last, with more time (it ran past 150 s in runbook 30 after k = 4)
    timeout 60 python3 -m pytest -q tests/kernels/test_page_union.py tests/kernels/test_synthetic_select.py \
        > "$OUT/kernels.log" 2>&1; tail -1 "$OUT/kernels.log"
    timeout 150 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 1 2 4 8 \
        --gpu-kv-budget 5GiB --graphs --recurring 0.86 --skip-prefill-attention --profile 12 \
        --json "$OUT/spec_verify_b1.json" > "$OUT/spec_verify_b1.log" 2>&1 || echo "FAILED: $?"
    tail -7 "$OUT/spec_verify_b1.log"
    timeout 150 python3 -m bench.spec_verify --context 131072 --batches 8 --ks 0 4 \
        --gpu-kv-budget 6GiB --graphs --recurring 0.86 --skip-prefill-attention \
        --json "$OUT/spec_verify_b8.json" > "$OUT/spec_verify_b8.log" 2>&1 || echo "FAILED: $?"
    tail -4 "$OUT/spec_verify_b8.log"
    timeout 240 python3 -u -m bench.gpu_verify_check > "$OUT/verify_check.log" 2>&1 || echo "FAILED: $?"
    tail -6 "$OUT/verify_check.log" ;;
32) # the next session first (issue 7): runbook 31's batch-1 rows again, twice (its wall-time
    # ratio at k = 4 was 1.29x and 1.36x in two runs; the synthetic draw now counts a row's
    # seen pages once, a review's fix), then k = 4 at 500K (the per-query select's rows there
    # are 31K pages: the split select's shape)
    # (the first with each row's kernels in GPU order, and the decode graph step's: where
    # the verification's span exceeds its kernel time, bench/trace_gaps.py)
    for rep in 1 2; do
        trace=""; [ $rep = 1 ] && trace="--trace $OUT"
        timeout 150 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 1 4 \
            --gpu-kv-budget 5GiB --graphs --recurring 0.86 --skip-prefill-attention --reps 9 $trace \
            --json "$OUT/spec_verify_b1_$rep.json" > "$OUT/spec_verify_b1_$rep.log" 2>&1 || echo "FAILED: $?"
        tail -4 "$OUT/spec_verify_b1_$rep.log"
    done
    python3 -m bench.trace_gaps "$OUT"/trace_b1_decode.json "$OUT"/trace_b1_k0.json \
        "$OUT"/trace_b1_k4.json --top 25 > "$OUT/trace_gaps.log" 2>&1; grep "per step" "$OUT/trace_gaps.log"
    timeout 300 python3 -m bench.spec_verify --context 500000 --batches 1 --ks 0 4 \
        --gpu-kv-budget 1536MiB --graphs --recurring 0.86 --skip-prefill-attention --profile 12 \
        --json "$OUT/spec_verify_500k.json" > "$OUT/spec_verify_500k.log" 2>&1 || echo "FAILED: $?"
    tail -3 "$OUT/spec_verify_500k.log" ;;
37) # (issue 7) runbook 36's k = 4 graphs ran `_select_probe_kernel` at 41 us per layer, the
    # select_bench time of probe4 on its 40 rows (probe2 / hist: 27-29 us). Which method the
    # engine picked and why (each method's timed best, printed), then the same with probe2 and
    # hist forced everywhere; the union as one sorting kernel ("sort", the default now)
    # against runbook 36's two ("walk"); the union kernels' tests on the GPU first (as run
    # then: the sort kernel and spec_verify's --union-method were removed after runbook 38)
    python3 -m pytest -q -p no:cacheprovider tests/kernels/test_page_union.py 2>&1 | tail -2
    for sel in default probe2 hist; do
        extra=""; [ "$sel" != default ] && extra="--select-method $sel"
        timeout 150 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 4 \
            --gpu-kv-budget 5GiB --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention \
            --reps 9 $extra --json "$OUT/spec_verify_$sel.json" > "$OUT/spec_verify_$sel.log" 2>&1 || echo "FAILED: $?"
        echo "== select $sel"; tail -5 "$OUT/spec_verify_$sel.log"
    done
    timeout 150 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 4 \
        --gpu-kv-budget 5GiB --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention \
        --reps 9 --union-method walk --json "$OUT/spec_verify_walk.json" > "$OUT/spec_verify_walk.log" 2>&1 || echo "FAILED: $?"
    echo "== union walk"; tail -5 "$OUT/spec_verify_walk.log" ;;
43) # (ran ad hoc in the seventh session's last device seconds; reverted before: the
    # picker's charge for the split select's extra kernels) the decode graph step with
    # split and probe2 forced in two processes on one machine, then the final code's k = 4
    for sel in split probe2; do
        timeout 75 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 \
            --gpu-kv-budget 5GiB --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention \
            --reps 3 --select-method $sel > "$OUT/sv_$sel.log" 2>&1
        tail -1 "$OUT/sv_$sel.log"
    done
    timeout 80 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 4 \
        --gpu-kv-budget 5GiB --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention \
        --reps 5 > "$OUT/sv.log" 2>&1; tail -5 "$OUT/sv.log" ;;
42) # (issues 6 and 7; ran with a select picker that charged the split select 2.9 us per
    # extra kernel, reverted after runbook 43) batch 1 at 128K twice, batch 8 once, then
    # issue 6's 128K rows
    for rep in 1 2; do
        timeout 120 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 4 \
            --gpu-kv-budget 5GiB --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention \
            --reps 9 --json "$OUT/spec_verify_b1_$rep.json" > "$OUT/spec_verify_b1_$rep.log" 2>&1 || echo "FAILED: $?"
        tail -5 "$OUT/spec_verify_b1_$rep.log"
    done
    timeout 150 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants realistic worst \
        --prefetch off forecast oracle --skip-prefill-attention --json "$OUT/e2e_128k.json" \
        > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -8 "$OUT/e2e_128k.log"
    timeout 100 python3 -m bench.spec_verify --context 131072 --batches 8 --ks 0 4 \
        --gpu-kv-budget 6GiB --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention \
        --json "$OUT/spec_verify_b8.json" > "$OUT/spec_verify_b8.log" 2>&1 || echo "FAILED: $?"
    tail -5 "$OUT/spec_verify_b8.log" ;;
41) # (issue 7) a verification's graphs in pieces of 1, 2, 4, ... layers (verify_cuts: the GPU
    # waits only for the first small piece's launch, not an 8-layer one's 0.3-0.5 ms); with
    # runbook 40's compacted fetch list. The graphs' check first (graph == eager, speculative
    # tokens == plain decoding), then batch 1 at 128K with 4 and 5 pieces
    timeout 330 python3 -u -m bench.gpu_verify_check > "$OUT/verify_check.log" 2>&1 || echo "FAILED: $?"
    tail -6 "$OUT/verify_check.log"
    timeout 200 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 4 \
        --gpu-kv-budget 5GiB --graphs --chunks 4 5 --recurring 0.86 --skip-prefill-attention \
        --reps 9 --json "$OUT/spec_verify.json" > "$OUT/spec_verify.log" 2>&1 || echo "FAILED: $?"
    tail -8 "$OUT/spec_verify.log" ;;
40) # (issues 6 and 7) the allocator's fetch list compacted on the device (kernels.tier_alloc
    # _assign_kernel: owners first, the gather walks only them): runbook 39's gather took
    # 16 us per layer in a decode step for ~28 missing units of 1,312 entries, 37 us in a
    # k = 4 verification. The tier kernels' tests on the GPU, then the verification rows
    # (with 16 and 32 gather programs), then issue 6's 128K rows
    python3 -m pytest -q -p no:cacheprovider tests/kernels/test_tier_alloc.py \
        tests/kernels/test_tier_kernels.py 2>&1 | tail -2
    for progs in 16 32; do
        mkdir -p "$OUT/t$progs"
        AGENTCTX_GATHER_PROGRAMS=$progs timeout 150 python3 -m bench.spec_verify --context 131072 \
            --batches 1 --ks 0 4 --gpu-kv-budget 5GiB --graphs --chunks 4 --recurring 0.86 \
            --skip-prefill-attention --reps 9 --trace "$OUT/t$progs" \
            --json "$OUT/spec_verify_p$progs.json" > "$OUT/spec_verify_p$progs.log" 2>&1 || echo "FAILED: $?"
        echo "== gather programs $progs"; tail -5 "$OUT/spec_verify_p$progs.log"
        python3 -m bench.trace_gaps "$OUT/t$progs"/trace_b1_decode.json "$OUT/t$progs"/trace_b1_k4_c4.json \
            --top 30 > "$OUT/trace_gaps_p$progs.log" 2>&1
        grep "per step\|_gather_kernel\|gaps between" "$OUT/trace_gaps_p$progs.log"
        rm -rf "$OUT/t$progs"
    done
    timeout 300 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants realistic worst \
        --prefetch off forecast oracle --skip-prefill-attention --json "$OUT/e2e_128k.json" \
        > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -8 "$OUT/e2e_128k.log" ;;
39) # (issue 7) runbook 38: the verification graphs ran with ~0.47 us between kernels and 35
    # device-to-device copies per step (some with 14 us before each); the decode graph with
    # probe2 forced, ~0.1 us and none. What a graph's kernel boundaries cost by the node kinds
    # it holds; then where the verification's copies run (the union back to the walk)
    timeout 60 python3 -m bench.graph_gaps > "$OUT/graph_gaps.log" 2>&1 || echo "FAILED: $?"
    cat "$OUT/graph_gaps.log"
    mkdir -p "$OUT/t"
    timeout 150 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 4 \
        --gpu-kv-budget 5GiB --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention \
        --reps 9 --trace "$OUT/t" --json "$OUT/spec_verify.json" \
        > "$OUT/spec_verify.log" 2>&1 || echo "FAILED: $?"
    tail -5 "$OUT/spec_verify.log"
    python3 -m bench.trace_gaps "$OUT/t"/trace_b1_decode.json "$OUT/t"/trace_b1_k4_c4.json \
        --top 30 --around Memcpy > "$OUT/trace_gaps.log" 2>&1
    grep "per step\|gaps between" "$OUT/trace_gaps.log"; grep -A 40 "around" "$OUT/trace_gaps.log" | head -45
    rm -rf "$OUT/t" ;;
38) # (issue 7, and issue 6's decode) runbook 37: the picker's isolated timings (5 calls back
    # to back) ranked split < probe2 for a decode's 8 rows and probe2 for a verification's 40,
    # but in the steps probe2 ran at 41 us for 40 rows (31 isolated), and forcing probe2 made
    # the decode graph step 11.90 -> 11.47 ms. The select methods with cold caches (each call
    # after a 256 MiB write), then the kernels of the steps with the default pick (the union
    # sorted) and with probe2 forced
    timeout 150 python3 -m bench.select_bench --contexts 131072 131328 --budgets 0.02 \
        --methods probe1 probe2 hist split --cold --json "$OUT/select_cold.json" \
        > "$OUT/select_cold.log" 2>&1 || echo "FAILED: $?"
    tail -10 "$OUT/select_cold.log"
    for sel in default probe2; do
        extra=""; [ "$sel" != default ] && extra="--select-method $sel"
        mkdir -p "$OUT/t_$sel"
        timeout 150 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 4 \
            --gpu-kv-budget 5GiB --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention \
            --reps 9 --trace "$OUT/t_$sel" $extra --json "$OUT/spec_verify_$sel.json" \
            > "$OUT/spec_verify_$sel.log" 2>&1 || echo "FAILED: $?"
        echo "== select $sel"; tail -5 "$OUT/spec_verify_$sel.log"
        python3 -m bench.trace_gaps "$OUT/t_$sel"/trace_b1_decode.json "$OUT/t_$sel"/trace_b1_k4_c4.json \
            --top 30 > "$OUT/trace_gaps_$sel.log" 2>&1; grep "per step" "$OUT/trace_gaps_$sel.log"
        rm -rf "$OUT/t_$sel"
    done ;;
36) # the next session first (issue 7): where k = 4's last ~0.2 ms over 1.3x the decode graph
    # step goes with 4 graphs per verification (runbook 35: 15.55 ms against 11.86 ms); each
    # row's 15 costliest kernels and the traces' busy/idle split (the per-query select over
    # 40 rows, the union kernels, the union's fetch), then the issue-6 baseline again at 128K
    # (worst and realistic selections, prefetch off / forecast / oracle)
    timeout 200 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 4 \
        --gpu-kv-budget 5GiB --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention \
        --reps 9 --profile 15 --trace "$OUT" --json "$OUT/spec_verify_b1.json" \
        > "$OUT/spec_verify_b1.log" 2>&1 || echo "FAILED: $?"
    tail -4 "$OUT/spec_verify_b1.log"
    python3 -m bench.trace_gaps "$OUT"/trace_b1_decode.json "$OUT"/trace_b1_k0_c4.json \
        "$OUT"/trace_b1_k4_c4.json --top 25 > "$OUT/trace_gaps.log" 2>&1; grep "per step" "$OUT/trace_gaps.log"
    rm -f "$OUT"/trace_*.json
    # the select methods on a verification's rows (batch 5: 40 rows), 8,192 and 8,208 pages
    # (the probe took 41 us per layer in the k = 4 graphs, against 27 us for 64 rows of
    # 8,192 pages in runbook 28's select_bench)
    timeout 120 python3 -m bench.select_bench --contexts 131072 131328 --budgets 0.02 \
        --methods probe1 probe2 probe4 hist split torch --json "$OUT/select.json" \
        > "$OUT/select.log" 2>&1 || echo "FAILED: $?"
    tail -10 "$OUT/select.log"
    timeout 300 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants realistic worst \
        --prefetch off forecast oracle --skip-prefill-attention --json "$OUT/e2e_128k.json" \
        > "$OUT/e2e_128k.log" 2>&1 || echo "FAILED: $?"
    tail -8 "$OUT/e2e_128k.log" ;;
35) # (issue 7) the verification's staged block tables rewritten only past each sequence's
    # committed pages (engine/verify_graphs.py fill_verify_staging: ~0.15 ms per 8K-page
    # table at batch 1, 1.2 ms at batch 8 on the host before the first graph). The graphs'
    # check first (speculative tokens with rollbacks == plain decoding), then batch 1 twice
    # and batch 8 at 128K with 4 graphs (a cold machine's check took 233 s alone: its 200 s
    # limit here cut it after k = 4 in the sixth session's run)
    timeout 330 python3 -u -m bench.gpu_verify_check > "$OUT/verify_check.log" 2>&1 || echo "FAILED: $?"
    tail -6 "$OUT/verify_check.log"
    for rep in 1 2; do
        timeout 130 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 1 4 \
            --gpu-kv-budget 5GiB --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention \
            --reps 9 --json "$OUT/spec_verify_b1_$rep.json" > "$OUT/spec_verify_b1_$rep.log" 2>&1 || echo "FAILED: $?"
        tail -4 "$OUT/spec_verify_b1_$rep.log"
    done
    timeout 150 python3 -m bench.spec_verify --context 131072 --batches 8 --ks 0 4 \
        --gpu-kv-budget 6GiB --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention \
        --json "$OUT/spec_verify_b8.json" > "$OUT/spec_verify_b8.log" 2>&1 || echo "FAILED: $?"
    tail -3 "$OUT/spec_verify_b8.log" ;;
33) # (issue 7) each verification in 4 CUDA graphs (engine/verify_graphs.py VERIFY_CHUNKS:
    # the GPU runs the first while the host launches the rest; runbook 32's traces showed the
    # GPU idle ~1 ms before a 2,800-kernel graph's first kernel) and its inputs in one copy.
    # First the graphs' check (graph against eager: logits, speculative tokens), then batch
    # 1 at 128K with 1 and 4 graphs in the same run, twice (the first with kernel traces)
    timeout 200 python3 -u -m bench.gpu_verify_check > "$OUT/verify_check.log" 2>&1 || echo "FAILED: $?"
    tail -8 "$OUT/verify_check.log"
    for rep in 1 2; do
        trace=""; [ $rep = 1 ] && trace="--trace $OUT"
        timeout 170 python3 -m bench.spec_verify --context 131072 --batches 1 --ks 0 1 4 \
            --gpu-kv-budget 5GiB --graphs --chunks 1 4 --recurring 0.86 --skip-prefill-attention \
            --reps 9 $trace --json "$OUT/spec_verify_b1_$rep.json" > "$OUT/spec_verify_b1_$rep.log" 2>&1 || echo "FAILED: $?"
        tail -7 "$OUT/spec_verify_b1_$rep.log"
    done
    python3 -m bench.trace_gaps "$OUT"/trace_b1_k4_c1.json "$OUT"/trace_b1_k4_c4.json --top 5 \
        > "$OUT/trace_gaps.log" 2>&1; grep "per step" "$OUT/trace_gaps.log"
    rm -f "$OUT"/trace_b1_k1_*.json ;;
34) # (issue 7) batch 8 at 128K with 1 and 4 graphs; batch 1 at 500K (a 2.25 GiB GPU tier: the
    # k = 4 union took 7,576 of 1.5 GiB's 6,144 slots per layer in runbook 32)
    timeout 250 python3 -m bench.spec_verify --context 131072 --batches 8 --ks 0 4 \
        --gpu-kv-budget 6GiB --graphs --chunks 1 4 --recurring 0.86 --skip-prefill-attention \
        --json "$OUT/spec_verify_b8.json" > "$OUT/spec_verify_b8.log" 2>&1 || echo "FAILED: $?"
    tail -5 "$OUT/spec_verify_b8.log"
    timeout 300 python3 -m bench.spec_verify --context 500000 --batches 1 --ks 0 4 \
        --gpu-kv-budget 2304MiB --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention \
        --json "$OUT/spec_verify_500k.json" > "$OUT/spec_verify_500k.log" 2>&1 || echo "FAILED: $?"
    tail -3 "$OUT/spec_verify_500k.log" ;;
27) # (ran in runbook 27) batch-8 verification with the recurring draws for a verification's
    # later queries too (engine/kv/tiers.py _select_per_query; on the real model a k = 4
    # verification fetched 4.4x a one-token step, bench.verify_union; the H200 bench's
    # random draws fetched 11x in runbook 25), batch 1 and 8, k = 0, 1, 2, 4 (issue 7).
    # The table's last two columns: the verification graph's GPU span (CUDA events around
    # its input copies and replay) against the decode graph step's; wall minus span is the
    # host's share (the decode graph hides its host work by launching a step ahead).
    # First the verification graphs' check: their inputs now go through numpy into pinned
    # staging (engine/verify_graphs.py fill_verify_staging), not through torch.tensor(lists)
    timeout 150 python3 -m bench.gpu_verify_check > "$OUT/verify_check.log" 2>&1 || echo "FAILED: $?"
    tail -8 "$OUT/verify_check.log"
    for run in "1 5GiB" "8 6GiB"; do
        set -- $run
        timeout 250 python3 -m bench.spec_verify --context 131072 --batches $1 --ks 0 1 2 4 \
            --gpu-kv-budget $2 --graphs --recurring 0.86 --skip-prefill-attention \
            --json "$OUT/spec_verify_b$1.json" > "$OUT/spec_verify_b$1.log" 2>&1 || echo "FAILED: $?"
        tail -6 "$OUT/spec_verify_b$1.log"
    done ;;
16) # selections whose new pages mostly recur, as the real model's do (docs/quality.md):
    # the prefetch modes at 128K, and the batch-8 verification's cost with them (issues 6, 7)
    timeout 200 python3 -m bench.e2e_sparse --context 131072 --batch 1 --variants recurring \
        --prefetch off forecast auto oracle --skip-prefill-attention --json "$OUT/e2e_128k_recurring.json" \
        > "$OUT/e2e_128k_recurring.log" 2>&1 || echo "FAILED: $?"
    tail -4 "$OUT/e2e_128k_recurring.log"
    timeout 220 python3 -m bench.spec_verify --context 131072 --batches 8 --ks 0 4 \
        --gpu-kv-budget 6GiB --graphs --recurring 0.86 --skip-prefill-attention --json "$OUT/spec_verify_b8_recurring.json" \
        > "$OUT/spec_verify_b8_recurring.log" 2>&1 || echo "FAILED: $?"
    tail -4 "$OUT/spec_verify_b8_recurring.log" ;;
23) # batch-8 verification (k = 4 against one token) with the Forecast prefetch on both the
    # one-token steps and the verifications (issue 7's 1.3x goal: hide the union's transfers)
    timeout 200 python3 -m bench.spec_verify --context 131072 --batches 8 --ks 0 4 \
        --gpu-kv-budget 6GiB --graphs --recurring 0.86 --prefetch forecast --skip-prefill-attention \
        --json "$OUT/spec_verify_b8_prefetch.json" > "$OUT/spec_verify_b8_prefetch.log" 2>&1 \
        || echo "FAILED: $?"
    tail -4 "$OUT/spec_verify_b8_prefetch.log" ;;
9)  # verification in CUDA graphs (engine.verify_graphs; not yet run on a GPU): graph == eager
    # on the same inputs and in greedy speculation, then its wall time at 128K (issue 7)
    timeout 150 python3 -m bench.gpu_verify_check > "$OUT/verify_check.log" 2>&1 || echo "FAILED: $?"
    tail -8 "$OUT/verify_check.log"
    # (batch 8: a 6 GiB tier holds the fixed union width of k <= 4 for 8 sequences)
    for run in "1 5GiB 0 1 2 4 8" "8 6GiB 0 1 2 4"; do
        set -- $run
        b=$1 tier=$2; shift 2
        timeout 200 python3 -m bench.spec_verify --context 131072 --batches $b --ks "$@" \
            --gpu-kv-budget $tier --graphs --json "$OUT/spec_verify_graphs_b$b.json" \
            > "$OUT/spec_verify_graphs_b$b.log" 2>&1 || echo "FAILED: $?"
        tail -8 "$OUT/spec_verify_graphs_b$b.log"
    done ;;
esac
