"""The one list of secret-looking paths: no tool shows them to the model, and packing
leaves them out.

A path is secret when:
- a folder on the way holds git's or a tool's own data (`.git/`, `.ssh/`, `.aws/`...);
- its name is a key, a certificate bundle or a credentials file whatever its form
  (`.env*`, `*.pem`, `*.key`, `id_rsa*`, `.netrc`, `.npmrc`, `.pypirc`...);
- its name or a folder's name says secret, credential, password or API key (`secrets.yaml`,
  `credentials.json`, `config/secrets/prod.toml`), unless the file is source code or prose:
  `secrets.py`, `credential_helper.go` or `docs/secrets.md` implement or describe the
  handling of secrets and are what a question about it needs; the values live in data
  and config files, which these names still refuse.

Names are compared case-insensitively (`.ENV` is `.env` on a case-insensitive disk).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import PurePosixPath

# Folders whose whole content is refused: git's internals (config with credentials in
# remote URLs, hooks, objects of every branch) and the data of ssh, gpg and cloud clients.
SECRET_DIRS = frozenset({".git", ".ssh", ".gnupg", ".aws", ".azure", ".kube"})
# Names refused whatever the extension.
SECRET_NAMES = (
    ".env",
    ".env*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "*.ppk",
    "*.kdbx",
    "*.tfstate",
    "*.tfstate.*",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".netrc",
    "_netrc",
    ".npmrc",
    ".pypirc",
    ".pgpass",
    ".git-credentials",
    ".htpasswd",
    ".dockercfg",
    ".boto",
    ".s3cfg",
)
# Words that make a data or config file secret, in its name or a folder's.
SECRET_WORDS = ("*secret*", "*credential*", "*password*", "*passwd*", "*apikey*", "*api_key*")
# Source code and prose: a name with a secret word is a module or a document about secrets.
# fmt: off
CODE_SUFFIXES = frozenset((
    ".py", ".pyi", ".pyx", ".ipynb", ".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx", ".go",
    ".rs", ".java", ".kt", ".kts", ".scala", ".rb", ".php", ".c", ".h", ".cc", ".cpp", ".cxx",
    ".hh", ".hpp", ".cs", ".fs", ".swift", ".m", ".mm", ".dart", ".lua", ".pl", ".pm", ".r",
    ".jl", ".ex", ".exs", ".erl", ".hs", ".ml", ".clj", ".elm", ".vue", ".svelte",
    ".md", ".rst", ".adoc",
))
# fmt: on


def is_secret(relative_path: str) -> bool:
    """Whether a path relative to the root (POSIX or OS separators) looks like a secret."""
    parts = [p.lower() for p in PurePosixPath(relative_path.replace("\\", "/")).parts]
    parts = [p for p in parts if p not in ("", ".", "/")]
    if not parts:
        return False
    name = parts[-1]
    if SECRET_DIRS.intersection(parts):
        return True
    if any(fnmatchcase(name, pattern) for pattern in SECRET_NAMES):
        return True
    if PurePosixPath(name).suffix in CODE_SUFFIXES:
        return False
    return any(fnmatchcase(part, word) for part in parts for word in SECRET_WORDS)


def secret_reason(relative_path: str) -> str:
    """The one line a tool answers for a secret path."""
    return f"refused: {relative_path} looks like a secret (keys, credentials, .env, .git/)"
