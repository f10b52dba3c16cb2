"""An answer about a repository, checked against the repository before it is final.

A small model's wrong answers about code are often wrong in ways the files show at once: a
`path:line` past the end of its file, or on a line no class or function holds; a function
named that the repository never defines; an exception no one defines; asked what a function
returns, only where it is; or, asked which function does something, no function at all; or
that the repository does nothing (asked again with only its README's opening paragraph).
When an answer has such a fault, the turn goes on one step: the model is shown what the
files say (the faults; where each line it cited lands, from agentctx.references; where each
definition it named is, and what that definition's own lines say, from
agentctx.definition_facts) and asked the question again. Once per turn: the new answer
stands when the same check finds fewer faults in it and it still names a function the first
named that the files did not dispute, else the first does; the references of the one that
stands are shown under it as usual.

An answer with none of these faults is never sent back: a right answer is not put at risk
for a check that has nothing to say.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass
from typing import Any

from agentctx import definition_facts
from agentctx.references import (
    MAX_FILE_BYTES,
    NO_DEFINITION,
    Index,
    is_code,
    last_name,
    references,
)
from tools.errors import ToolError
from tools.repo_files import list_files, read_text

# the question asks for a definition: "which function", "where is X defined", ...
_ASKS_FOR_CODE = re.compile(
    r"\b(?:functions?|methods?|class(?:es)?|decorators?|defined?|definitions?|implement\w*)\b",
    re.I,
)
_KIND = r"(?:function|method|class|decorator)"
_NAME = r"[A-Za-z_][\w.]*"
# a name the answer calls a function, method, class or decorator: "the `foo` function",
# "function `foo`", "def foo(", "class Foo", and the name a sentence about one comes to:
# "The function that removes the styling is `foo`"
_CLAIMED = re.compile(
    rf"`({_NAME})(?:\(\))?`\s+{_KIND}\b"
    rf"|\b{_KIND}\s+(?:named\s+|called\s+)?`({_NAME})(?:\(\))?`"
    rf"|\bdef\s+({_NAME})\(|\bclass\s+([A-Z]\w*)"
    rf"|\b{_KIND}e?s?\b[^\n.;]{{0,160}}?\b(?:is|are)\s+`({_NAME})(?:\(\))?`"
)
_BUILTINS = frozenset(dir(builtins))
# a name the answer gives an exception: `UnknownBackendError`, "raises a UsageError"
_EXCEPTION = re.compile(r"(?<![\w.])([A-Z]\w*(?:Error|Exception))\b")
# the question asks what something returns, raises or yields
_ASKS_WHAT = re.compile(r"\bwhat\b[^?]*?\b(return|raise|yield)s?\b", re.I)
# an answer that says the repository does nothing (a small model's answer to "what does
# this repository do" when the packed files confused it)
_DENIES = re.compile(
    r"\b(?:does not|doesn't|do not|don't) (?:do|contain|have) anything\b|\bdoes nothing\b", re.I
)
MAX_README_FACT = 600  # characters of the README's opening shown to the model
MAX_SHOWN = 2  # places a name is assigned at, shown to the model
SETTLED = ("stop", "length")  # how a new answer ends for `Revision.settle` to weigh it


@dataclass(frozen=True, slots=True)
class Check:
    """What the files say against an answer: `faults`, each a line the model is shown (no
    faults: the answer stands); `facts`, where each line it cited lands and where each
    definition it names is (a citation past its file's end is often the right lines of the
    file that defines the name: the model is shown that file)."""

    faults: list[str]
    facts: list[str]
    claims: list[str]  # the names it calls a class or function that the repository defines
    denies: bool = False  # it said the repository does nothing (shown the README's opening)

    def prompt(self, question: str) -> str:
        """The user message that asks the question again (sent without the answer it
        checked: a small model shown its own answer writes it again)."""
        lines = ["An answer to this question was checked against the repository's files:"]
        lines += [f"- {line}" for line in self.faults + self.facts]
        if self.denies and len(self.faults) == 1:  # (a question about the whole project:
            # only what the README says; a small model repeats a fault's words)
            return "\n".join([*self.facts, "Answer this question in a sentence or two, from "
                              f"what the README says: {question}"])  # fmt: skip
        lines.append(
            "Answer all that the question asks, with this in mind, and name the function or "
            "class that does it, with its file and line as the files show them. Use a tool "
            f"to read the code if you need to. The question: {question}"
        )
        return "\n".join(lines)

    def summary(self) -> str:
        """One line for the user: why the answer is asked again."""
        return "checked against the files: " + "; ".join(self.faults) + "; answering again"


def check(answer: str, question: str, root: str | None) -> Check | None:
    """The faults of `answer` about the repository at `root` (None: nothing to say, or the
    repository cannot be listed now; a check never fails its turn)."""
    found = inspect(answer, question, root)
    return found if found is not None and found.faults else None


def inspect(answer: str, question: str, root: str | None) -> Check | None:
    """What the files say against `answer`, faults or none (None: no answer, or the
    repository cannot be listed now)."""
    if not root or not answer.strip():
        return None
    try:
        return _check(answer, question, root)
    except (ToolError, OSError):
        return None


def _check(answer: str, question: str, root: str) -> Check:
    files = list_files(root)
    index = Index(root, files)  # the references' too: a file is parsed once
    refs = references(answer, root, files, index)
    asks_for_code = bool(_ASKS_FOR_CODE.search(question))
    faults = [r.line() for r in refs if r.definition is None and _unresolved(r, asks_for_code)]
    cited = [r for r in refs if r.definition is not None and r.cited]
    claimed, exceptions = _claimed(answer), _exceptions(answer)
    index.find({last_name(n) for n in claimed} | set(exceptions))
    undefined = [n for n in claimed if not index.found(n)]
    faults += [_undefined(n, root, files) for n in undefined]
    defined = [n for n in claimed if n not in undefined]
    faults += _elsewhere(defined, cited, index)
    faults += [
        f"`{e}` is no exception of the repository or of Python" for e in exceptions
        if not index.found(e)
    ]  # fmt: skip
    verb = _ASKS_WHAT.search(question)
    if verb and not re.search(rf"\b{verb.group(1)[:4]}", answer, re.I):  # rais(es|ing)
        faults.append(f"the answer does not say what it {verb.group(1)}s, which the question asks")
    names_one = any(r.definition is not None for r in refs)
    if not faults and not names_one and asks_for_code:
        faults.append("the answer names no class or function that the repository defines")
    opening = _readme_opening(root, files) if _DENIES.search(answer) else None
    if opening:
        faults.append("the README says what the repository is for")
    facts = _facts(refs, index, question) if faults else []
    facts += [f"The repository's README begins: {opening}"] if opening else []
    return Check(faults, facts, defined, denies=bool(opening))


def _readme_opening(root: str, files: list[str]) -> str | None:
    """The first paragraph of prose of the top-level README (headings and code blocks
    skipped), or None."""
    name = next((f for f in files if "/" not in f and f.lower().startswith("readme")), None)
    if name is None:
        return None
    try:
        text = read_text(root, name, MAX_FILE_BYTES)
    except (ToolError, OSError):
        return None
    in_fence = False
    for block in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in block.strip().splitlines()]
        fences = sum(ln.startswith("```") for ln in lines)
        if in_fence or fences or not lines:  # (code, in one block or spread over several)
            in_fence ^= fences % 2 == 1
            continue
        if lines[0].startswith(("#", "<", "[!", "![")):
            continue
        return " ".join(lines)[:MAX_README_FACT]
    return None


def _facts(refs: list, index: Index, question: str) -> list[str]:
    """Where each line the answer cited lands, where each name it gave is defined, and what
    those definitions' own lines say (their docstrings; their raise lines, when the question
    asks what is raised)."""
    raises = bool(re.search(r"\brais|\bexceptions?\b|\berrors?\b", question, re.I))
    out = [r.line() for r in refs if r.definition is not None and r.cited]
    out += [
        f"`{r.definition.name}` is defined at {r.definition.span()}"
        for r in refs if r.definition is not None and not r.cited
    ]  # fmt: skip
    seen = []
    for r in refs:
        if r.definition is not None and r.definition not in seen:
            seen.append(r.definition)
            out += definition_facts.facts(index, r.definition, raises)
    return out


def _unresolved(ref, asks_for_code: bool) -> bool:
    """Whether a citation that resolves to no definition is a fault: a file that is not
    there or lacks the line always; lines outside every definition only of a code file, and
    only when the question asks for a definition (a README's line, or a module constant,
    is a fine citation otherwise)."""
    if ref.why != NO_DEFINITION:
        return True
    return asks_for_code and is_code(ref.cited.rsplit(":", 1)[0])


def _claimed(answer: str) -> list[str]:
    """The names the answer calls a function, method, class or decorator, each once;
    Python's builtins left out (the answer may say what a function raises or calls)."""
    out: list[str] = []
    for m in _CLAIMED.finditer(answer):
        name = next(g for g in m.groups() if g).strip(".")
        if name and last_name(name) not in _BUILTINS and name not in out:
            out.append(name)
    return out


def _exceptions(answer: str) -> list[str]:
    """The names the answer writes that read as exceptions, Python's own left out."""
    out: list[str] = []
    for name in _EXCEPTION.findall(answer):
        if name not in _BUILTINS and name not in out:
            out.append(name)
    return out


def _elsewhere(claimed: list[str], cited: list, index: Index) -> list[str]:
    """A fault when every name the answer calls a function or class is defined somewhere
    other than every line it cites: the answer's name and its citation disagree."""
    if not claimed or not cited:
        return []
    held = {part for r in cited for part in r.definition.name.split(".")}
    if any(last_name(n) in held for n in claimed):
        return []
    out = []
    for name in claimed:
        spans = ", ".join(f"{d.path}:{d.start}" for d in index.found(name)[:MAX_SHOWN])
        where = "; ".join(f"{r.cited} is in `{r.definition.name}`" for r in cited)
        out.append(f"`{name}` is defined at {spans}, not where the answer cites it ({where})")
    return out


def _undefined(name: str, root: str, files: list[str]) -> str:
    """The fault of a claimed name no class or function of the repository has: where it is
    assigned instead and, when what it is assigned is a definition of the repository, that
    definition first (`self.parse_object = JSONObject`: the function meant is most likely
    `JSONObject`); or that it is defined nowhere."""
    last = re.escape(last_name(name))
    assigned = re.compile(rf"^[ \t]*(?:[\w.]+\.)?{last}[ \t]*(?::[^=\n]*)?=(?!=)[ \t]*(.*)$", re.M)
    places: list[tuple[str, str]] = []  # (path:line `the assignment`, the name it assigns)
    for path in files:
        if len(places) >= MAX_SHOWN or not is_code(path):
            continue
        try:
            text = read_text(root, path, MAX_FILE_BYTES)
        except (ToolError, OSError):
            continue
        for m in assigned.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            value = re.fullmatch(r"[A-Za-z_][\w.]*", m.group(1).strip())
            value = last_name(value.group(0)) if value else ""
            places.append((f"{path}:{line} `{m.group(0).strip()[:120]}`", value))
    if not places:
        return f"`{name}` is defined nowhere in the repository"
    lead = f"`{name}` is no class or function of the repository"
    index = Index(root, files)
    index.find({v for _, v in places if v and v != last_name(name)})
    for place, value in places:
        found = index.found(value) if value != last_name(name) else []
        if 0 < len(found) <= MAX_SHOWN:
            spans = ", ".join(d.span() for d in found)
            return (f"{lead}: {place} assigns it `{found[0].name}`, the function or class it "
                    f"stands for, defined at {spans}")  # fmt: skip
    return f"{lead}: it is assigned at " + "; ".join(p for p, _ in places[:MAX_SHOWN])


@dataclass(slots=True)
class Revision:
    """A turn's answer check: the faults of its first answer ([]: it stands), the step that
    keeps that answer, and whether the first answer stood after all (`settle`)."""

    question: str
    root: str | None
    faults: list[str]
    step: Any = None  # agentctx.agent.ToolStep
    claims: tuple[str, ...] = ()  # what the first answer calls a function of the repository
    kept_first: bool = False

    def settle(self, answer: str, output) -> str:
        """The answer that stands: the new one, unless the files contradict it as much as
        the first (a small model asked again may write the question back, or the same
        fault), or the first called a function of the repository by name and the new one
        does not name it (the check said where that function is, not that it is the wrong
        one; the 0.5B, shown where the line it cited lands, answered with that line's
        class instead): then the first, and `output` is told."""
        again = inspect(answer, self.question, self.root) if answer.strip() else None
        why = _worse(again, self) if answer.strip() else "it is empty"
        if not why:
            return answer
        self.kept_first = True
        output.info(f"the new answer is no better by the files ({why}): the first one stands")
        return self.step.content

    def usage(self) -> dict:
        """What the turn's usage record says of the check (nothing when it passed)."""
        if not self.faults:
            return {}
        return {"answer_check": self.faults, "answer_check_kept_first": self.kept_first}


def _worse(again: Check | None, first: Revision) -> str:
    """Why a new answer is no better than the first by the files ("": it is better, or
    cannot be checked now)."""
    if again is None:
        return ""
    if len(again.faults) >= len(first.faults):
        return "; ".join(again.faults)
    kept = {last_name(n) for n in first.claims} & {last_name(n) for n in again.claims}
    if first.claims and not kept:
        named = ", ".join(f"`{n}`" for n in first.claims)
        return f"it no longer names {named}, which the files do not contradict"
    return ""


def revise(content, question, root, steps, convo, output, record) -> Revision:
    """The check of a turn's answer (Revision; no faults: it stands). With faults, the
    answer is kept as a step of its own (the record stores it, then what the model is
    told), and the next step's prompt asks the question again with what the files say,
    after the prompt the answer came from: without the answer itself, which a small model
    given greedy decoding copies word for word (Qwen2.5-Coder-1.5B did, 6 answers of 6,
    with the answer left in)."""
    from agentctx.agent import ToolStep

    found = check(content, question, root)
    if found is None:
        return Revision(question, root, [])
    step = ToolStep(content, [], after=found.prompt(question))
    steps.append(step)
    convo.append({"role": "user", "content": step.after})
    revising = getattr(output, "revising", None)
    (revising or output.info)(found.summary())
    if record is not None:
        record.step(step)
    return Revision(question, root, found.faults, step, tuple(found.claims))
