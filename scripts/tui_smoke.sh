#!/usr/bin/env bash
# A real-terminal check of the TUI that a person can repeat: `agentctx tui` runs in a
# detached tmux session of a fixed size (120x40) with a private AGENTCTX_HOME, on a tiny
# git repository, with the quick model (SmolLM2, `--model smollm2-135m`). tmux send-keys
# drives it through: ask, cancel (Esc), follow-up, resume (quit, then `agentctx tui -c`),
# `/export PATH` and quit. After each step the pane is captured (tmux capture-pane -p) and
# printed; a step whose expected text does not show in time stops the run with exit 1.
#
#   bash scripts/tui_smoke.sh            # from the repository root, after `make setup`
#   MODEL=qwen2.5-coder-0.5b KEEP=1 bash scripts/tui_smoke.sh   # another model; keep the files
#
# It needs tmux (Debian/Ubuntu: apt-get install -y tmux).
set -euo pipefail

if ! command -v tmux >/dev/null 2>&1; then
    echo "tui_smoke.sh: tmux is not installed (Debian/Ubuntu: apt-get install -y tmux)" >&2
    exit 2
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
MODEL=${MODEL:-smollm2-135m}
WAIT=${WAIT:-180}  # seconds a step may take (the first loads the model)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/agentctx-smoke.XXXXXX")
TMUX_SOCKET="$WORK/tmux.sock"
NAME=smoke
export AGENTCTX_HOME="$WORK/home"
mkdir -p "$AGENTCTX_HOME"

tm() { tmux -S "$TMUX_SOCKET" "$@"; }

cleanup() {
    tm kill-server 2>/dev/null || true
    if [[ -z "${KEEP:-}" ]]; then rm -rf "$WORK"; else echo "kept: $WORK"; fi
}
trap cleanup EXIT

# the repository the TUI reads: one commit of a tiny calculator
REPO="$WORK/calc"
mkdir -p "$REPO"
printf '# calc\n\nA tiny calculator library.\n' >"$REPO/README.md"
printf 'def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n' >"$REPO/calc.py"
git -C "$REPO" init -q
git -C "$REPO" add README.md calc.py
git -C "$REPO" -c user.name=smoke -c user.email=smoke@example.com commit -qm initial

pane() { tm capture-pane -p -t "$NAME"; }

show() {  # the pane as it is now, under a heading
    echo "===== $1 ====="
    pane
    echo
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds, else fail
    local limit=$1 what=$2 waited=0
    shift 2
    until "$@"; do
        if ((waited >= limit * 2)); then
            show "MISSING after ${limit} s: $what"
            echo "tui_smoke.sh: the screen never showed $what" >&2
            exit 1
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
}

shows() { pane | grep -qF -- "$1"; }

count() { pane | grep -cF -- "$1" || true; }

more_than() { (($(count "$1") > $2)); }

expect() {  # expect TEXT [SECONDS]: wait until the pane shows TEXT, else fail
    wait_for "${2:-$WAIT}" "$1" shows "$1"
}

expect_more() {  # expect_more TEXT N: wait until TEXT shows on more than N lines
    wait_for "$WAIT" "one more '$1'" more_than "$1" "$2"
}

type_line() {  # type a line into the prompt and send it
    tm send-keys -t "$NAME" -l -- "$1"
    tm send-keys -t "$NAME" Enter
}

quit() {  # quit STEP: Ctrl-Q, then the TUI must exit 0 within 30 s
    local code=""
    tm send-keys -t "$NAME" C-q
    for _ in $(seq 60); do
        [[ -s "$WORK/exit" ]] && code=$(<"$WORK/exit") && break
        sleep 0.5
    done
    if [[ $code != 0 ]]; then
        show "$1"
        echo "tui_smoke.sh: after Ctrl-Q the TUI did not exit 0 (exit status: ${code:-none})" >&2
        exit 1
    fi
    echo "===== $1: the TUI exited 0 ====="
}

start() {  # start ARGS...: agentctx tui in the pane (the checkout's code: cwd first); its
    # exit status goes to $WORK/exit
    local cmd
    cmd=$(printf ' %q' "$PYTHON" -m agentctx tui --repo "$REPO" --model "$MODEL" "$@")
    rm -f "$WORK/exit"
    tm respawn-pane -k -t "$NAME" \
        "cd $(printf %q "$ROOT") &&$cmd; echo \$? >$(printf %q "$WORK/exit")"
}

tm -f /dev/null new-session -d -s "$NAME" -x 120 -y 40 "sleep 600"
tm set -g escape-time 0
tm set -g remain-on-exit on
DONE="tokens in context"  # the summary line after each answer

echo "agentctx TUI smoke: $MODEL, 120x40, AGENTCTX_HOME=$AGENTCTX_HOME"
start
expect "new session" 60
show "started"

# ask
type_line "What does add do?"
expect "$DONE"
show "ask: an answer and its summary line"

# cancel: a long answer, Esc while it streams
type_line "/set max_tokens 2000"
expect "max_tokens = 2000"
answers=$(count "$DONE")
type_line "Explain every line of calc.py in great detail, then write ten tests for it."
expect "decoding"
tm send-keys -t "$NAME" Escape
expect "interrupted"
show "cancel: Esc stopped the answer"

# follow-up
type_line "/set max_tokens 48"
expect "max_tokens = 48"
answers=$(count "$DONE")
type_line "And what does sub do?"
expect_more "$DONE" "$answers"
show "follow-up"

# resume: quit, then agentctx tui -c
quit "quit before resuming"
start -c
expect "What does add do?" 60
expect "And what does sub do?" 5
show "resume: tui -c shows the session's turns"

# /export PATH
type_line "/export $WORK/talk.md"
expect "exported"
show "/export $WORK/talk.md"
grep -qF "What does add do?" "$WORK/talk.md" || { echo "tui_smoke.sh: talk.md lacks the first question" >&2; exit 1; }
grep -qF "And what does sub do?" "$WORK/talk.md" || { echo "tui_smoke.sh: talk.md lacks the follow-up" >&2; exit 1; }
echo "talk.md: $(wc -l <"$WORK/talk.md") lines, both questions in it"

# quit
quit "quit"
echo "tui_smoke.sh: all steps passed"
