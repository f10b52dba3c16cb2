"""The answer evaluation's question set (answer_eval_questions.json) and its repositories.

Each repository is a real package that was not written for this project: a standard-library
package, or a pure-Python package installed in the venv. It is copied into a temporary git
repository (its .py files under the package's own folder, one commit), so the tools and the
packing see what they see in any checkout.

The set is checked before any model runs: every expected file must exist, and every
expected symbol must be defined in it at exactly the recorded lines. A package upgraded
under the questions fails here, loudly, instead of grading answers against moved code.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

QUESTIONS_PATH = Path(__file__).with_name("answer_eval_questions.json")
COPIED_SUFFIXES = (".py", ".pyi", ".typed")


class QuestionSetError(Exception):
    """The question set is malformed or no longer matches its repositories."""


@dataclass(frozen=True)
class Answer:
    file: str
    symbol: str  # qualified within the file: Class.method, outer.inner
    lines: tuple[int, int]  # the definition's first and last line


@dataclass(frozen=True)
class Question:
    id: str
    repo: str
    question: str
    answers: tuple[Answer, ...]
    facts: tuple[str, ...] = ()  # any one must appear in the answer


@dataclass(frozen=True)
class RepoSpec:
    name: str
    package: str
    kind: str  # "stdlib" or "site"
    version: str
    about: str = ""


@dataclass
class QuestionSet:
    repos: dict[str, RepoSpec]
    questions: list[Question] = field(default_factory=list)
    suffix: str = ""  # said after every question: what a gradable answer names

    def prompt(self, q: Question) -> str:
        return q.question + self.suffix


def load(path: str | os.PathLike[str] = QUESTIONS_PATH) -> QuestionSet:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        repos = {name: RepoSpec(name, **spec) for name, spec in data["repos"].items()}
        questions = [
            Question(
                q["id"],
                q["repo"],
                q["question"],
                tuple(Answer(a["file"], a["symbol"], tuple(a["lines"])) for a in q["answers"]),
                tuple(q.get("facts", ())),
            )
            for q in data["questions"]
        ]
        suffix = str(data.get("suffix", ""))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise QuestionSetError(f"cannot read the question set {path}: {e!r}") from None
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        raise QuestionSetError(f"{path}: question ids repeat")
    for q in questions:
        if q.repo not in repos:
            raise QuestionSetError(f"{q.id}: unknown repository {q.repo!r}")
        if not q.answers:
            raise QuestionSetError(f"{q.id}: no expected answer")
    return QuestionSet(repos, questions, suffix)


def package_dir(spec: RepoSpec, override: str | os.PathLike[str] | None = None) -> Path:
    """Where the package's sources are, after checking it is the recorded version.

    override: a folder holding the package's sources (its __init__.py at the top), taken
    instead of the installed package and without the version lookup (a machine whose
    python or venv has another version); check() still refuses a copy whose expected
    symbols are not at the recorded lines."""
    if override is not None:
        source = Path(override)
        if not (source / "__init__.py").is_file():
            raise QuestionSetError(
                f"{spec.name}: --package-dir {override} is not a package folder (no __init__.py)"
            )
        return source
    if spec.kind == "stdlib":
        found = f"{sys.version_info.major}.{sys.version_info.minor}"
    elif spec.kind == "site":
        try:
            found = importlib.metadata.version(spec.package)
        except importlib.metadata.PackageNotFoundError:
            raise QuestionSetError(
                f"{spec.name}: package {spec.package} is not installed"
            ) from None
    else:
        raise QuestionSetError(f"{spec.name}: kind must be stdlib or site, not {spec.kind!r}")
    if found != spec.version:
        raise QuestionSetError(
            f"{spec.name}: the questions are for {spec.package} {spec.version}, this is {found}"
        )
    module = importlib.util.find_spec(spec.package)
    if module is None or not module.submodule_search_locations:
        raise QuestionSetError(f"{spec.name}: {spec.package} is not a package")
    return Path(list(module.submodule_search_locations)[0])


def build_repo(
    spec: RepoSpec, parent: Path, override: str | os.PathLike[str] | None = None
) -> Path:
    """Copy the package (or the override's sources, see package_dir) into
    parent/<name>/<package>/ and commit it; returns the root."""
    source = package_dir(spec, override)
    root = parent / spec.name
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if path.is_file() and path.suffix in COPIED_SUFFIXES and "__pycache__" not in rel.parts:
            target = root / spec.package / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "answer-eval", "GIT_AUTHOR_EMAIL": "answer-eval@example.com",
        "GIT_COMMITTER_NAME": "answer-eval", "GIT_COMMITTER_EMAIL": "answer-eval@example.com",
        "GIT_AUTHOR_DATE": "1709294400 +0000", "GIT_COMMITTER_DATE": "1709294400 +0000",
    }  # fmt: skip
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["commit", "-q", "-m", f"{spec.package} {spec.version}"],
    ):
        subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True)
    return root


def definitions(source: str) -> dict[str, list[tuple[int, int]]]:
    """Qualified name -> (first, last) line of each def, class and module-level assignment."""
    found: dict[str, list[tuple[int, int]]] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                found.setdefault(name, []).append((child.lineno, child.end_lineno))
                walk(child, name + ".")
            elif isinstance(child, ast.Assign | ast.AnnAssign) and not prefix:
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        found.setdefault(t.id, []).append((child.lineno, child.end_lineno))

    walk(ast.parse(source), "")
    return found


def check(qs: QuestionSet, roots: dict[str, Path]) -> None:
    """QuestionSetError naming every expected answer that its repository no longer holds."""
    problems = []
    cache: dict[Path, dict[str, list[tuple[int, int]]]] = {}
    for q in qs.questions:
        root = roots[q.repo]
        for a in q.answers:
            path = root / a.file
            if not path.is_file():
                problems.append(f"{q.id}: {a.file} is not in {q.repo}")
                continue
            if path not in cache:
                cache[path] = definitions(path.read_text(encoding="utf-8"))
            spans = cache[path].get(a.symbol)
            if not spans:
                problems.append(f"{q.id}: {a.file} defines no {a.symbol}")
            elif tuple(a.lines) not in spans:
                where = ", ".join(f"{s}-{e}" for s, e in spans)
                problems.append(
                    f"{q.id}: {a.symbol} is at {a.file}:{where}, not {a.lines[0]}-{a.lines[1]}"
                )
    if problems:
        raise QuestionSetError(
            f"the question set does not match its repositories ({len(problems)} problems): "
            + "; ".join(problems)
        )
