"""Which of a repository's files a question is about: one ranking across every kind of file.

BM25 over each file's path, content and symbol names orders all files; boilerplate (licences,
issue and PR templates, lock files, minified and vendored files, empty files) comes after
every other file whatever it scores, so it never displaces one that matters. An overview
question ("What does this repository do?") has no word that picks a file, so it ranks by
what tells a newcomer most: the README, then design docs, then the entry points.
Words are compared folded (tools.fold): "Borodinó" matches "borodino".
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import PurePosixPath

from tools.fold import fold, strip_accents

# BM25's usual constants; path words count extra since a file's name says what it is about,
# and the names a file defines count extra since they are what a question names.
BM25_K1 = 1.2
BM25_B = 0.75
PATH_WEIGHT = 3
SYMBOL_WEIGHT = 2
# A file that defines a name the question says ("Where is JSONDecoder defined?") gains this
# many times the name's idf: it beats the files that only mention the name, however often.
DEFINES_WEIGHT = 3.0

# camelCase and snake_case pieces: "parseHTTPHeader_v2" -> parse, HTTP, Header, v, 2; a run of
# letters outside ASCII (after accents are stripped: Cyrillic, Greek, CJK) is one piece.
_WORD_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+|[^\W\dA-Za-z_]+")
_WORD = re.compile(r"\w+")
# Question words that say nothing about which file matters.
_STOPWORD_TEXT = (
    "a an and are as at be by can do does for from how i in is it its me of on or "
    "the this that to what when where which who why with you your there here did was were "
    "has have had"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
# Suffixes the stemmer takes off, longest first ("ation" is left on: "allocation" should meet
# "allocate" at "allocat").
_SUFFIXES = ("ings", "ing", "ions", "ion", "ers", "er", "ors", "or", "ed", "es", "s", "e")
# Words of a question about the project as a whole; with the project's own name, a question
# made of nothing else is an overview question.
_OVERVIEW_TEXT = (
    "repository repo project codebase code base package library lib module tool program app "
    "application software overview purpose summary summarize summarise describe description "
    "explain explanation about used use usage work works main goal goals idea general high "
    "level architecture structure organized organised overall whole tell give intro "
    "introduction brief briefly short mean"
)
_OVERVIEW = frozenset(_OVERVIEW_TEXT.split())

DOC_SUFFIXES = frozenset({".md", ".rst", ".markdown", ".adoc"})
DOC_DIRS = frozenset({"docs", "doc", "documentation"})
# Docs whose name says they explain the design, read first for an overview.
DESIGN_STEMS = frozenset(
    {
        "architecture", "design", "overview", "intro", "introduction", "index", "readme",
        "getting_started", "getting-started", "gettingstarted", "quickstart", "usage",
        "guide", "tutorial", "concepts", "internals",
    }
)  # fmt: skip
CODE_SUFFIXES = frozenset({".py", ".js", ".ts", ".rs", ".go", ".rb", ".java", ".c", ".cc", ".cpp"})
MANIFEST_NAMES = frozenset(
    {"pyproject.toml", "setup.py", "setup.cfg", "package.json", "cargo.toml", "go.mod",
     "makefile", "cmakelists.txt", "build.gradle", "pom.xml", "gemfile"}
)  # fmt: skip
# Where a program starts: the command line first, then an app or a library's root.
ENTRY_NAMES = frozenset({"__main__.py", "cli.py", "main.py", "main.rs", "main.go", "cli.js"})
SECONDARY_ENTRY_STEMS = frozenset({"app", "index", "lib", "server"})

# Files that are never what a question is about, however they score.
BOILERPLATE_NAMES = frozenset(
    {
        "license", "licence", "copying", "notice", "unlicense", "authors", "code_of_conduct",
        "pull_request_template", "issue_template", "codeowners", "funding", "py.typed",
        ".gitignore", ".agentctxignore", ".gitattributes", ".editorconfig", ".dockerignore", ".mailmap",
        ".pre-commit-config", "manifest.in",
    }
)  # fmt: skip
LOCK_NAMES = frozenset(
    {"package-lock.json", "yarn.lock", "pnpm-lock.yaml", "poetry.lock", "uv.lock", "cargo.lock",
     "pipfile.lock", "composer.lock", "gemfile.lock", "go.sum", "npm-shrinkwrap.json"}
)  # fmt: skip
GENERATED_SUFFIXES = (".min.js", ".min.css", ".map", ".svg", ".lock")
VENDOR_DIRS = frozenset(
    {"vendor", "vendored", "_vendor", "third_party", "third-party", "thirdparty",
     "node_modules", "bower_components", "external", "extern",
     # what a build wrote: packages, bundles, copies of the sources
     "dist", "build", "site-packages", "__pypackages__"}
)  # fmt: skip
TEMPLATE_DIRS = frozenset({"issue_template", "pull_request_template", "discussion_template"})
# Data a program wrote (results, logs) matches a question's words by repeating them; its
# relevance counts this much.
DATA_SUFFIXES = frozenset({".json", ".jsonl", ".ndjson", ".log", ".csv", ".tsv", ".out"})
DATA_WEIGHT = 0.5
# Source with lines this long on average is minified (or data), not written by hand.
MINIFIED_LINE_CHARS = 500


def rank_paths(
    texts: dict[str, str],
    question: str,
    symbols: dict[str, list[str]] | None = None,
    project_names: frozenset[str] = frozenset(),
) -> list[str]:
    """Paths in packing order: most relevant first, boilerplate last."""
    symbols = symbols or {}
    scores = relevance(texts, question, symbols)
    for path in scores:
        if PurePosixPath(path).suffix.lower() in DATA_SUFFIXES:
            scores[path] *= DATA_WEIGHT  # machine output: its words repeat, it explains little
    overview = is_overview(question, project_names)

    def order(path: str) -> tuple[bool, float, float, int, str]:
        prior = overview_prior(path)
        if overview:  # the words match anything; what a newcomer reads first decides
            return (is_boilerplate(path, texts[path]), -prior, -scores[path], _depth(path), path)
        # ties (often all zero) go to the files a reader would open first
        return (is_boilerplate(path, texts[path]), -scores[path], -prior, _depth(path), path)

    return sorted(texts, key=order)


def relevance(
    texts: dict[str, str], question: str, symbols: dict[str, list[str]] | None = None
) -> dict[str, float]:
    """BM25 score of each text (keyed by path) for the question; 0 when nothing matches."""
    query = query_terms(question)
    if not query:
        return dict.fromkeys(texts, 0.0)
    symbols = symbols or {}
    # compounds only matter when the question names one, and cost a second pass over the text
    with_compounds = term_counts(question, True).keys() != term_counts(question, False).keys()
    lengths: dict[str, int] = {}
    matches: dict[str, Counter[str]] = {}
    for path, text in texts.items():
        terms = term_counts(text, with_compounds)
        for term, number in term_counts(path, with_compounds).items():
            terms[term] += PATH_WEIGHT * number
        for term, number in term_counts(" ".join(symbols.get(path, ())), with_compounds).items():
            terms[term] += SYMBOL_WEIGHT * number
        lengths[path] = terms.total()
        # only query terms are kept: the rest matter only through the length
        matches[path] = Counter({term: terms[term] for term in query if term in terms})

    documents = len(texts)
    average_length = sum(lengths.values()) / documents or 1.0
    frequency = Counter(term for counts in matches.values() for term in counts)
    idf = {
        term: math.log(1 + (documents - frequency[term] + 0.5) / (frequency[term] + 0.5))
        for term in query
    }
    # the words of the question as written, for names a file defines ("Engine", not "engin")
    named = {fold(word) for word in _WORD.findall(question)} - _STOPWORDS
    named_idf = {word: idf.get(stem(word), max(idf.values(), default=0.0)) for word in named}
    scores: dict[str, float] = {}
    for path, counts in matches.items():
        norm = BM25_K1 * (1 - BM25_B + BM25_B * lengths[path] / average_length)
        scores[path] = sum(
            idf[term] * count * (BM25_K1 + 1) / (count + norm) for term, count in counts.items()
        )
        defined = {fold(name) for name in symbols.get(path, ())} & named
        scores[path] += DEFINES_WEIGHT * sum(named_idf[word] for word in defined)
    return scores


def stem(word: str) -> str:
    """A light English stemmer, so that "allocated" meets "allocate" and "allocation", and
    "parser" meets "parses"; short words and names with digits stay as they are."""
    if len(word) <= 4 or not word.isalpha():
        return word
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            if suffix == "s" and word.endswith("ss"):
                return word  # "process", "class"
            return word[: -len(suffix)]
    return word


_STOPWORD_STEMS = _STOPWORDS | {stem(word) for word in _STOPWORDS}
_OVERVIEW_STEMS = frozenset(stem(word) for word in _OVERVIEW)


def query_terms(question: str) -> set[str]:
    terms = term_counts(question, with_compounds=True)
    return {term for term in terms if len(term) > 1 and not term.isdigit()} - _STOPWORD_STEMS


def term_counts(text: str, with_compounds: bool) -> Counter[str]:
    """Folded identifier pieces, plus whole compound words so exact names match too."""
    text = strip_accents(text)
    counts: Counter[str] = Counter()
    # Counter over findall counts in C; folding per distinct piece keeps big repos fast
    for piece, number in Counter(_WORD_PART.findall(text)).items():
        counts[stem(piece.casefold())] += number
    if with_compounds:
        for word, number in Counter(_WORD.findall(text)).items():
            tail = word[1:]
            # a compound has an inner underscore or a case change after its first letter
            if "_" in word.strip("_") or (tail != tail.lower() and not word.isupper()):
                counts[word.casefold()] += number
    return counts


def is_overview(question: str, project_names: frozenset[str] = frozenset()) -> bool:
    """Whether the question asks about the project as a whole (no word in it names a part)."""
    names = {stem(name.casefold()) for name in project_names}
    names |= {piece for name in project_names for piece in term_counts(name, False)}
    return all(term in _OVERVIEW_STEMS or term in names for term in query_terms(question))


def overview_prior(path: str) -> float:
    """How much a file tells a newcomer about the project: README, design docs, manifests
    and entry points, other docs; 0 for the rest. Deeper files count less."""
    pure = PurePosixPath(path)
    name, depth = pure.name.lower(), len(pure.parts) - 1
    stem = name.split(".")[0]
    doc = pure.suffix.lower() in DOC_SUFFIXES
    in_docs = bool(pure.parts[:-1]) and pure.parts[0].lower() in DOC_DIRS
    if depth == 0 and stem == "readme":
        return 10.0
    if doc and stem in DESIGN_STEMS and (depth == 0 or in_docs) and depth <= 2:
        return 7.0 - depth
    if depth == 0 and name in MANIFEST_NAMES:
        return 5.0
    if name in ENTRY_NAMES and depth <= 2:
        return 5.0 - depth
    if stem in SECONDARY_ENTRY_STEMS and depth <= 2 and pure.suffix in CODE_SUFFIXES:
        return 3.5 - depth
    if doc and (depth == 0 or (in_docs and depth == 1)):
        return 3.0
    if name == "__init__.py" and depth == 1:
        return 1.0
    return 0.0


def is_boilerplate(path: str, text: str | None = None) -> bool:
    """Licences, templates, lock files, generated, minified or vendored files, empty files."""
    pure = PurePosixPath(path)
    name = pure.name.lower()
    stem = name.split(".")[0] if not name.startswith(".") else name.rsplit(".", 1)[0]
    lowered = [part.lower() for part in pure.parts[:-1]]
    if name in BOILERPLATE_NAMES or stem in BOILERPLATE_NAMES or name in LOCK_NAMES:
        return True
    if stem.startswith(("license", "licence", "copying")):
        return True
    if name.endswith(GENERATED_SUFFIXES) or any(part in VENDOR_DIRS for part in lowered):
        return True
    if any(part in TEMPLATE_DIRS for part in lowered):
        return True
    if lowered and lowered[-1] in DOC_DIRS and stem in ("makefile", "make"):
        return True  # Sphinx's build scripts
    if text is not None:
        if not text.strip():
            return True
        lines = text.count("\n") + 1
        if (
            pure.suffix.lower() in (".js", ".css", ".mjs")
            and len(text) / lines > MINIFIED_LINE_CHARS
        ):
            return True
    return False


def _depth(path: str) -> int:
    return path.count("/")
