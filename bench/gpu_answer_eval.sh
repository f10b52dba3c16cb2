#!/usr/bin/env bash
# The graded answer evaluation (bench.answer_eval) on the GPU machine, in one call.
#
# Run from the repository root, with the bundle of scripts/eval_bundle.py carried at .whl/eval
# and the model staged at $STAGE/qwen2.5-coder-0.5b-q4_k_m.gguf by earlier calls:
#   bash bench/gpu_answer_eval.sh [more bench.answer_eval options: --limit N, --only ID,ID, ...]
# It checks the model's sha256; installs what the device's python lacks into $STAGE/py (once:
# see .whl/eval/MANIFEST); converts the GGUF once into $STAGE/home (AGENTCTX_HOME, kept across
# calls while the machine stays warm); then runs the evaluation with --resume into
# $OUT/answer_eval_gpu.json, written after every question. Progress continues across calls:
# the JSON is seeded from $RESUME (a file carried from an earlier call's $OUT, default
# .whl/eval-results/answer_eval_gpu.json) or from $STAGE/results (an earlier call of this lease),
# whichever holds more graded answers. The evaluation is stopped (SIGINT) at DEADLINE_S seconds
# after the start (default 570, under the device's 600 s per call), so the summary still prints.
set -uo pipefail

STAGE=${STAGE:-/root/stage}
BUNDLE=${BUNDLE:-.whl/eval}
MODEL=${MODEL:-$STAGE/qwen2.5-coder-0.5b-q4_k_m.gguf}
MODEL_SHA256=${MODEL_SHA256:-1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32}
DEVICE=${DEVICE:-cuda}
DEADLINE_S=${DEADLINE_S:-570}
RESUME=${RESUME:-.whl/eval-results/answer_eval_gpu.json}
read -ra PY <<<"${PYTHON:-python3}" # the device's python (a command line, for a dry run)
NAME=answer_eval_gpu

fail() {
  echo "gpu_answer_eval: $*" >&2
  exit 2
}

[ -n "${OUT:-}" ] || fail "OUT is not set (the folder whose files come back)"
mkdir -p "$OUT" || fail "cannot create OUT=$OUT"
[ -f "$BUNDLE/MANIFEST" ] || fail "no $BUNDLE/MANIFEST: build it with scripts/eval_bundle.py and carry $BUNDLE"
[ -f bench/answer_eval.py ] || fail "run from the repository root (no bench/answer_eval.py in $PWD)"

# (a) the staged model
[ -f "$MODEL" ] || fail "model not staged: $MODEL is missing"
start=$SECONDS
got=$(sha256sum "$MODEL" | cut -d' ' -f1)
[ "$got" = "$MODEL_SHA256" ] || fail "model $MODEL has sha256 $got, not $MODEL_SHA256 (incomplete or wrong pieces)"
echo "model ok: $MODEL ($(stat -c %s "$MODEL") bytes, sha256 checked in $((SECONDS - start)) s)"

# (b) what the device's python lacks, into $STAGE/py, once per bundle
target=$STAGE/py
. bench/gpu_modules.sh
install_modules "$BUNDLE" "$target"

# (c) the environment
export PYTHONPATH="$target:$PWD" AGENTCTX_HOME="$STAGE/home"
"${PY[@]}" -c 'import platform, torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"python {platform.python_version()}, torch {torch.__version__}, {gpu}")' || fail "python or torch does not start"

# the conversion, timed on its own (cached under $AGENTCTX_HOME/cache/gguf)
"${PY[@]}" -c 'import sys, time
from agentctx.app_paths import cache_dir
from engine.loading.gguf_checkpoint import gguf_to_checkpoint
t = time.perf_counter()
path = gguf_to_checkpoint(sys.argv[1], cache_root=cache_dir() / "gguf")
print(f"checkpoint: {path} ({time.perf_counter() - t:.1f} s; cached if under a second)")' "$MODEL" ||
  fail "converting $MODEL failed"

# (d) the evaluation, continuing the best earlier JSON
json=$OUT/$NAME.json
mkdir -p "$STAGE/results"
if [ ! -f "$json" ]; then
  best=$("${PY[@]}" -c 'import json, sys
def graded(p):
    try:
        return sum("grade" in r for run in json.load(open(p))["runs"] for r in run["records"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1
n, p = max((graded(p), p) for p in sys.argv[1:])
print(f"{n} {p}" if n > 0 else "")' "$RESUME" "$STAGE/results/$NAME.json")
  if [ -n "$best" ]; then
    cp "${best#* }" "$json" && echo "resuming from ${best#* } (${best%% *} graded answers)"
  fi
fi
left=$((DEADLINE_S - SECONDS - 10))
[ "$left" -gt 30 ] || fail "only $left s left of DEADLINE_S=$DEADLINE_S for the evaluation"
echo "evaluation: up to $left s (setup took $SECONDS s)"
start=$SECONDS
timeout -s INT -k 20 "$left" "${PY[@]}" -m bench.answer_eval --model "$MODEL" --device "$DEVICE" \
  --weights dense --package-dir json="$BUNDLE/src/json" --json "$json" --md "$OUT/$NAME.md" \
  --resume "$@"
rc=$?
[ "$rc" -eq 124 ] && echo "evaluation stopped at the deadline after $((SECONDS - start)) s (the questions done are in $json)"
[ -f "$json" ] && cp "$json" "$STAGE/results/$NAME.json.tmp" && mv "$STAGE/results/$NAME.json.tmp" "$STAGE/results/$NAME.json"

# the timings, from the JSON
[ -f "$json" ] && "${PY[@]}" -c 'import json, sys
data = json.load(open(sys.argv[1]))
for run in data["runs"]:
    g, records = run.get, run["records"]
    correct = sum(r["grade"]["correct"] for r in records if "grade" in r)
    print("%s: weights %s, %s on %s, load %s s; %d/%d correct" % (g("model"), g("weights_mode"),
          g("dtype"), g("device"), g("load_s"), correct, len(records)))
    for r in records:
        u = r.get("usage") or {}
        what = ("correct" if r["grade"]["correct"] else "wrong") if "grade" in r else r.get("error")
        print("  %s: %s, wall %s s, ttft %s s, prompt %s tokens, decode %s tok/s" % (r["id"],
              what, r.get("wall_s"), u.get("ttft_s"), u.get("prompt_tokens"), u.get("decode_tok_s")))
' "$json"
echo "total $SECONDS s; exit $rc"
exit "$rc"
