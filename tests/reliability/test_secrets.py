"""Secret-looking files never reach the model, through any tool; one list decides
(tools.secrets.is_secret), and ordinary code named after secrets stays readable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.registry import run_tool
from tools.repo_files import list_files
from tools.secrets import is_secret

from .support import UNFORESEEN, commit_all, git, make_repo

SECRET = "sk-LIVE-0123456789"


@pytest.mark.parametrize(
    "path",
    [".env", ".env.local", "config/.env.production", ".ENV", ".envrc", "certs/server.pem",
     "tls/private.KEY", "id_rsa", "id_rsa.pub", "home/.ssh/id_ed25519", "deploy/id_ecdsa",
     ".git/config", ".git/HEAD", "sub/.git/objects/ab/cdef", ".ssh/config", ".aws/credentials",
     ".netrc", ".npmrc", ".pypirc", ".pgpass", ".git-credentials", "keystore.p12", "app.pfx",
     "credentials", "credentials.json", "gcp-credentials.yaml", "config/secrets.yml",
     "secrets.toml", "client_secret_123.json", "k8s/secrets/prod.yaml", "passwords.txt",
     "terraform.tfstate", "db_password", "config\\.env"],
)  # fmt: skip
def test_secret_paths(path: str) -> None:
    assert is_secret(path)


@pytest.mark.parametrize(
    "path",
    ["secrets.py", "tools/secrets.py", "credentials.go", "auth/credential_helper.ts",
     "k8s/secrets/__init__.py", "docs/secrets.md", "password_reset.rb", "environment.yml",
     "src/env.py", "envoy.yaml", ".gitignore", ".github/workflows/ci.yml", ".gitattributes",
     "keys.py", "monkey.txt", "tokenizer.json", "README.md", "Makefile", "", "."],
)  # fmt: skip
def test_ordinary_paths(path: str) -> None:
    assert not is_secret(path)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = make_repo(
        tmp_path / "repo",
        {
            ".gitignore": ".env\n",
            "app.py": "KEY = load()\n",
            "secrets.py": "def load():\n    return None\n",
            "config/credentials.json": f'{{"key": "{SECRET}"}}\n',
            "certs/server.pem": f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n",
        },
    )
    (root / ".env").write_text(f"API_KEY={SECRET}\n")  # ignored, as it usually is
    git(root, "remote", "add", "origin", f"https://user:{SECRET}@example.com/r.git")
    os.symlink(".env", root / "notes.txt")  # a harmless name leading to a secret
    (root / "config/credentials.json").write_text(f'{{"key": "{SECRET}-rotated"}}\n')
    (root / "app.py").write_text("KEY = load()  # changed\n")
    return root


def calls() -> list[tuple[str, dict]]:
    reads = [".env", ".git/config", "./.git/config", "config/credentials.json",
             "certs/server.pem", "notes.txt", "config/../.env", ".git/../.env"]  # fmt: skip
    out: list[tuple[str, dict]] = [("list_files", {})]
    for path in reads:
        out += [
            ("read_file", {"path": path}),
            ("outline", {"path": path}),
            ("git_blame", {"path": path}),
            ("git_log", {"path": path}),
            ("git_show", {"rev": "HEAD", "path": path}),
            ("git_show", {"rev": f"HEAD:{path}"}),
            ("git_diff", {"path": path}),
        ]
    out += [
        ("grep", {"pattern": "sk-LIVE"}),
        ("grep", {"pattern": "sk-LIVE", "path_glob": ".env"}),
        ("grep", {"pattern": "sk-LIVE", "path_glob": "*.json"}),
        ("git_show", {}),
        ("git_show", {"rev": "HEAD:"}),
        ("git_show", {"rev": "HEAD:config"}),
        ("git_diff", {}),
        ("git_diff", {"rev_a": "HEAD~1", "rev_b": "HEAD"}),
        ("git_log", {}),
    ]
    return out


def test_no_tool_shows_a_secret(repo: Path) -> None:
    (repo / "extra.env.txt").write_text("not secret by name\n")
    (repo / "new.key").write_text(f"{SECRET}\n")  # untracked: git_diff names untracked files
    commit_all(repo, "Second")  # a commit that changes secret files
    (repo / "config/credentials.json").write_text(f'{{"key": "{SECRET}-3"}}\n')
    for name, arguments in calls():
        result = run_tool(repo, name, arguments)
        assert SECRET not in result, (name, arguments, result)
        assert not result.startswith(UNFORESEEN), (name, arguments, result)
        for shown in ("server.pem", "credentials.json", "new.key"):
            asked = str(arguments.get("path", "")) + str(arguments.get("rev", ""))
            assert shown not in result or shown in asked, (name, arguments, result)


def test_a_refusal_says_why(repo: Path) -> None:
    assert run_tool(repo, "read_file", {"path": ".env"}) == (
        "error: refused: .env looks like a secret (keys, credentials, .env, .git/)"
    )
    assert run_tool(repo, "read_file", {"path": "notes.txt"}).startswith(
        "error: refused: notes.txt looks like a secret"
    )


def test_ordinary_files_stay_visible(repo: Path) -> None:
    assert list_files(repo) == [".gitignore", "app.py", "secrets.py"]
    assert run_tool(repo, "read_file", {"path": "secrets.py"}).startswith("secrets.py (lines 1-2")
    assert "def load()" in run_tool(repo, "outline", {"path": "secrets.py"})
    diff = run_tool(repo, "git_diff", {})
    assert "+KEY = load()  # changed" in diff and "credentials" not in diff
    show = run_tool(repo, "git_show", {"rev": "HEAD"})
    assert "secrets.py" in show and "server.pem" not in show
