"""Where a turn's events go: plain text (answer on stdout, progress on stderr) or JSON lines."""

from __future__ import annotations

import json
import sys

from agentctx.progress import Progress


def result_summary(call) -> str:
    """One line about a tool's result: its error, or its size and first line."""
    if call.error is not None:
        return f"error: {call.error.splitlines()[0]}"
    lines = (call.result or "").splitlines()
    first = lines[0][:80] if lines else ""
    return f"{len(lines)} lines: {first}" if len(lines) > 1 else first or "(empty)"


class SilentOutput:
    """An output that shows nothing: the base of one that keeps only part of a turn (a
    benchmark's, a test's)."""

    def info(self, line: str) -> None:
        pass

    def prefill(self, done: int, total: int) -> None:
        pass

    def text(self, delta: str) -> None:
        pass

    def compacted(self, line: str, data: dict) -> None:
        pass

    def tool_call(self, call) -> None:
        pass

    def tool_result(self, call) -> None:
        pass

    def end(self, usage: dict) -> None:
        pass


class TextOutput:
    def __init__(self, out=None, err=None):
        self.out = out or sys.stdout
        self.progress = Progress(err)
        self.open_line = False  # the answer's last line has no newline yet
        self.ended_line = False  # info() ended it, so end() does not add a blank line
        self.answered = False  # some answer text, not only white space, was written

    def info(self, line: str) -> None:
        if self.open_line:  # keep stderr lines off the end of the answer on a terminal
            self.out.write("\n")
            self.out.flush()
            self.open_line, self.ended_line = False, True
        self.progress.line(line)

    def prefill(self, done: int, total: int) -> None:
        self.progress.prefill(done, total)
        if done >= total:
            self.progress.end_prefill()

    def text(self, delta: str) -> None:
        self.out.write(delta)
        self.out.flush()
        self.open_line, self.ended_line = not delta.endswith("\n"), False
        self.answered = self.answered or bool(delta.strip())

    def compacted(self, line: str, data: dict) -> None:
        """What the prompt leaves out to fit the window (agentctx.compaction): its line."""
        self.info(line)

    def tool_call(self, call) -> None:
        self.info(f"-> {call.label()}")

    def tool_result(self, call) -> None:
        self.info(f"   {result_summary(call)}")

    def references(self, refs) -> None:
        """The answer's references (agentctx.references), after it on stdout."""
        from agentctx.references import render

        if self.open_line:
            self.out.write("\n")
        self.out.write("\n" + render(refs) + "\n")
        self.out.flush()
        self.open_line, self.ended_line = False, True

    def end(self, usage: dict) -> None:
        if not self.answered:  # an empty stdout would read as a hang or a crash
            calls = usage.get("tool_calls")
            self.progress.line(
                "no answer: the model stopped without writing one"
                + (f" (after {calls} tool calls)" if calls else "")
            )
        elif not self.ended_line:
            self.out.write("\n")
            self.out.flush()
        if usage.get("finish_reason") == "length":  # a cut answer must not read as whole
            self.progress.line(
                f"[the answer was cut at {usage.get('completion_tokens')} tokens, the "
                "--max-tokens limit: ask again with a larger one for the rest]"
            )
        if usage.get("prompt_tokens") is not None:
            self.progress.line(usage_summary(usage))


def _decoded(tokens, rate: float) -> str:
    """N tokens at R tok/s; one token has no rate (it came with the first token's time)."""
    if tokens == 1:
        return "1 token"
    return f"{tokens} tokens at {rate:.1f} tok/s"


def usage_summary(usage: dict) -> str:
    """The summary line of a turn's usage record: context and reuse, time to first token,
    tokens and their rate, then what the sparse cache, the prefetch, speculation and
    tool calls did (ask prints it on stderr, the TUI after each answer)."""
    return (
        f"{usage['prompt_tokens']} tokens in context ({usage['cached_tokens']} reused), "
        f"time to first token {usage['ttft_s']:.2f} s ({usage['prefill_tok_s']:,.0f} tok/s prefill), "
        + _decoded(usage["completion_tokens"], usage["decode_tok_s"])
        + (
            f"; sparse: {usage['selected_pages_per_step']:.0f} pages per layer-step, "
            f"{usage['fetch_fraction']:.1%} fetched from the host"
            if usage.get("selected_pages_per_step")
            else ""
        )
        + (
            f"; forecast recall {usage['forecast_recall']:.0%}, "
            f"{usage['prefetch_fraction'] or 0:.0%} of needed fetches done ahead"
            if usage.get("forecast_recall") is not None
            else ""
        )
        + prefetch_summary(usage.get("prefetch"))
        + (
            f"; speculative decoding: {usage['speculation']['mean_accepted']:.2f} tokens a "
            f"model step, {usage['speculation']['acceptance_rate']:.0%} of the guessed "
            "tokens kept"
            if usage.get("speculation")
            else ""
        )
        + (
            f"; tool calls: {usage['tool_calls']} made, {usage['tool_calls_parsed']} "
            f"parsed, {usage['tool_calls_succeeded']} succeeded, "
            f"{usage['tool_calls_malformed']} malformed"
            + (
                f", {n} run as the tool their arguments fit"
                if (n := usage.get("tool_calls_repaired"))
                else ""
            )  # fmt: skip
            if "tool_calls_parsed" in usage
            else ""
        )
        + (f"; session {usage['session']}" if usage.get("session") else "")
    )


def prefetch_summary(state: dict | None) -> str:
    """The summary line's prefetch part, "; prefetch on|off (why)", where a policy decides
    (none for "always")."""
    if not state or state["policy"] == "always":
        return ""
    on = "on" if state["on"] else "off"
    if state.get("trial_ms"):
        off_ms, on_ms = state["trial_ms"]
        why = f"timed: {off_ms:.1f} ms per step without, {on_ms:.1f} with"
    elif state.get("need_mib") is not None:
        why = f"the steps need {state['need_mib']:.2f} MiB per layer from the host"
    else:
        why = "no decode step measured yet"
    return f"; prefetch {on} ({why})"


class JsonOutput:
    """One JSON object per line on stdout: info, prefill, token, then a final usage record."""

    def __init__(self, out=None):
        self.out = out or sys.stdout

    def _emit(self, obj: dict) -> None:
        self.out.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self.out.flush()

    def info(self, line: str) -> None:
        self._emit({"type": "info", "message": line})

    def packing(self, line: str, manifest: dict) -> None:
        """The packing summary, with the manifest as data."""
        self._emit({"type": "info", "message": line, "manifest": manifest})

    def compacted(self, line: str, data: dict) -> None:
        """What the prompt leaves out to fit the window, as a "compaction" event."""
        self._emit({"type": "compaction", "message": line, **data})

    def prefill(self, done: int, total: int) -> None:
        self._emit({"type": "prefill", "prefilled": done, "total": total})

    def text(self, delta: str) -> None:
        self._emit({"type": "token", "text": delta})

    def tool_call(self, call) -> None:
        self._emit({"type": "tool_call", "name": call.name, "arguments": call.arguments})

    def tool_result(self, call) -> None:
        record = {"type": "tool_result", "name": call.name}
        record.update({"error": call.error} if call.error is not None else {"result": call.result})
        self._emit(record)

    def references(self, refs) -> None:
        self._emit({"type": "references", "references": [r.data() for r in refs]})

    def revising(self, line: str) -> None:
        """The answer so far is checked and asked for again (agentctx.answer_check): the
        tokens after this event are the new answer."""
        self._emit({"type": "answer_check", "message": line})

    def end(self, usage: dict) -> None:
        self._emit({"type": "usage", **usage})
