"""The packing manifest as data (the --json info event, the session store) and as text
(`ask --show-packing`, `/context` in the TUI, `sessions show`): every file packed in full,
truncated, in the map only (outlined, or by path and size), or left out, with tokens."""

from __future__ import annotations

from typing import Any

from agentctx.packing import REASON_BUDGET, REASON_TRUNCATED, PackedContext

MAP_PATH = "(repository map)"  # the map's record among a stored manifest's files
EXCERPT = "excerpt"  # a definition shown again before the question (agentctx.excerpts)


def manifest_data(packed: PackedContext) -> dict[str, Any]:
    """The manifest as JSON-ready data."""
    files, omitted = stored_manifest(packed)
    return {
        "tokens": packed.tokens,
        "budget": packed.budget,
        "commit": packed.commit,
        "map": files[0] if files and files[0].get("packed") == "map" else None,
        "files": [f for f in files if f.get("packed") not in ("map", EXCERPT)],
        "excerpts": [f for f in files if f.get("packed") == EXCERPT],
        "omitted": omitted,
        "warnings": list(packed.warnings),
    }


def stored_manifest(packed: PackedContext) -> tuple[list[dict], list[dict]]:
    """(files, omitted) as the session store keeps them; the map is the first file record."""
    files: list[dict[str, Any]] = []
    if packed.map is not None:
        m = packed.map
        files.append({"path": MAP_PATH, "tokens": m.tokens, "packed": "map", "files": m.files,
                      "listed": m.listed, "detail": m.detail, "notes": list(m.notes)})  # fmt: skip
    for f in packed.files:
        record: dict[str, Any] = {"path": f.path, "tokens": f.tokens, "packed": f.packed}
        if f.lines is not None:
            record.update(lines=f.lines, total_lines=f.total_lines)
        files.append(record)
    for e in packed.excerpts:
        files.append({"path": e.path, "tokens": e.tokens, "packed": EXCERPT, "symbol": e.name,
                      "start": e.start, "end": e.end})  # fmt: skip
    omitted = [
        {"path": o.path, "tokens": o.tokens, "reason": o.reason, "map": o.map}
        for o in packed.omitted
    ]
    return files, omitted


def report_lines(
    files: list[dict], omitted: list[dict], tokens: int | None = None, warnings=()
) -> list[str]:
    """The manifest as text, one section per way a file was packed."""
    out: list[str] = []
    if tokens is not None:
        out.append(f"context: {tokens:,} tokens")
    for f in files:
        if f.get("packed") == "map":
            listed = f.get("listed", f.get("files", 0))
            which = f"all {f['files']:,} files" if listed == f.get("files") else (
                f"{listed:,} of {f.get('files', 0):,} files")  # fmt: skip
            out.append(f"repository map: {which}, {f.get('tokens', 0):,} tokens "
                       f"({f.get('detail', '')})")  # fmt: skip
            out += [f"  shrunk to fit: {note}" for note in f.get("notes") or []]
    full = [f for f in files if f.get("packed", "full") == "full"]
    cut = [f for f in files if f.get("packed") == "truncated"]
    tails = {o.get("path"): o.get("tokens") for o in omitted if o.get("reason") == REASON_TRUNCATED}
    out += _section("packed in full", full, lambda f: "")
    out += _section("truncated", cut, lambda f: _cut_note(f, tails.get(f.get("path"))))
    again = [f for f in files if f.get("packed") == EXCERPT]
    out += _section("definitions shown again before the question", again, _excerpt_note,
                    noun="definition")  # fmt: skip
    rest = [o for o in omitted if o.get("reason") != REASON_TRUNCATED]
    outlined = [o for o in rest if o.get("map") == "outline"]
    listed = [o for o in rest if o.get("map") == "path"]
    left = [o for o in rest if not o.get("map")]
    out += _section("outlined, in the map only", outlined, _reason)
    out += _section("by path and size, in the map only", listed, _reason)
    out += _section("left out", left, _reason)
    out += [f"warning: {w}" for w in warnings]
    return out


def _section(title: str, items: list[dict], note, noun: str = "file") -> list[str]:
    if not items:
        return []
    total = sum(i.get("tokens") or 0 for i in items)
    noun = noun if len(items) == 1 else f"{noun}s"
    head = f"{title} ({len(items):,} {noun}" + (f", {total:,} tokens):" if total else "):")
    rows = []
    for item in items:
        tokens = item.get("tokens")
        amount = f"{tokens:,} tokens" if tokens is not None else "not read"
        rows.append(f"  {item.get('path')}  {amount}{note(item)}")
    return [head, *rows]


def _excerpt_note(f: dict) -> str:
    return f" ({f.get('symbol', '')}, lines {f.get('start')}-{f.get('end')})"


def _cut_note(f: dict, tail: int | None) -> str:
    lines, total = f.get("lines"), f.get("total_lines")
    shown = f" (lines 1-{lines:,} of {total:,})" if lines is not None and total else ""
    return shown + (f"; {tail:,} tokens left out" if tail else "")


def _reason(o: dict) -> str:
    reason = o.get("reason")
    return "" if reason in (REASON_BUDGET, None) else f" ({reason})"
