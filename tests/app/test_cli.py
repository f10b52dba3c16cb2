"""`agentctx ask` as a user runs it: a real subprocess, real git repositories, the real
default model. Bad input gives one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import git
import pytest

from engine.loading.default_model import default_model_path


def agentctx(
    *args: str, timeout: int = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentctx", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("agentctx: error:")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


@pytest.fixture
def small_repo(tmp_path) -> Path:
    root = tmp_path / "calc"
    root.mkdir()
    repo = git.Repo.init(root)
    (root / "README.md").write_text(
        "# calc\n\nA tiny calculator library that adds and multiplies numbers.\n"
    )
    (root / "calc.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef multiply(a, b):\n    return a * b\n"
    )
    (root / ".gitignore").write_text("secret.txt\n")
    (root / "secret.txt").write_text("do not read\n")
    repo.index.add(["README.md", "calc.py", ".gitignore"])
    repo.index.commit("initial")
    return root


@pytest.mark.e2e
@pytest.mark.slow
def test_ask_answers_about_a_repository(small_repo):
    """The real default model (the suite's config makes SmolLM2 the default elsewhere)."""
    from agentctx.models import DEFAULT_MODEL

    proc = agentctx("ask", "What does this project do?", "--repo", str(small_repo),
                    "--max-tokens", "60", "--model", DEFAULT_MODEL, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "calculator" in proc.stdout.lower() or "add" in proc.stdout.lower(), proc.stdout
    assert "packed 3 files" in proc.stderr  # README.md, calc.py, .gitignore; not secret.txt
    assert "prefill [" in proc.stderr and "tok/s" in proc.stderr


def test_repo_that_is_not_a_directory(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    assert_one_line_error(agentctx("ask", "q", "--repo", str(f)), "not a directory")


def test_repo_that_does_not_exist(tmp_path):
    assert_one_line_error(agentctx("ask", "q", "--repo", str(tmp_path / "nope")), "does not exist")


@pytest.mark.slow
def test_empty_repository(tmp_path):
    git.Repo.init(tmp_path / "empty")
    assert_one_line_error(agentctx("ask", "q", "--repo", str(tmp_path / "empty")), "no text files")


def test_missing_model_path(tmp_path):
    proc = agentctx("ask", "q", "--repo", str(tmp_path), "--model", str(tmp_path / "missing.gguf"))
    assert_one_line_error(proc, "not found", "missing.gguf")


@pytest.mark.slow
def test_model_cache_that_cannot_be_written_is_one_clear_line(small_repo, tmp_path):
    """The default model's conversion hits a file-size limit (as on a full disk): one line,
    and no half-written conversion left in the cache."""
    import resource
    import signal

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))

    home = tmp_path / "home"
    proc = subprocess.run(
        [sys.executable, "-m", "agentctx", "ask", "q", "--repo", str(small_repo)],
        capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size,
        env={**os.environ, "AGENTCTX_HOME": str(home)},
    )  # fmt: skip
    assert_one_line_error(proc, "cannot write the converted model", "File too large")
    assert list((home / "cache" / "gguf").iterdir()) == []


def test_truncated_gguf(tmp_path):
    half = tmp_path / "half.gguf"
    data = default_model_path().read_bytes()
    half.write_bytes(data[: len(data) // 2])
    assert_one_line_error(
        agentctx("ask", "q", "--repo", str(tmp_path), "--model", str(half)), "half.gguf"
    )


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    assert_one_line_error(
        agentctx("ask", "q", "--repo", str(tmp_path), "--model", str(bad)), "bad.gguf"
    )


def test_unsupported_architecture(tmp_path):
    model = tmp_path / "gpt2"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 8})
    )
    proc = agentctx("ask", "q", "--repo", str(tmp_path), "--model", str(model))
    assert_one_line_error(proc, "GPT2LMHeadModel")


@pytest.mark.slow
def test_prompt_longer_than_the_window(small_repo):
    question = "why " * 9000
    proc = agentctx("ask", question, "--repo", str(small_repo))
    assert_one_line_error(proc, "8192")
    assert "tokens" in proc.stderr


def test_usage_error_exits_2():
    proc = agentctx("ask")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_sparse_decode_over_a_small_gpu_tier(small_repo, kv_dtype):
    result = agentctx(
        "ask", "What does this repository do?", "--repo", str(small_repo), "--no-save",
        "--max-tokens", "12", "--sparse", "25%", "--gpu-kv-budget", "40MB", "--weights", "dense",
        "--forecast", "free", "--prefetch", "always", "--kv-dtype", kv_dtype,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "sparse: " in result.stderr and "fetched from the host" in result.stderr
    assert "forecast recall" in result.stderr and "done ahead" in result.stderr


def test_summary_line_says_why_the_prefetch_is_off_or_on():
    from agentctx.output import prefetch_summary

    timed = {"policy": "timed", "on": False, "need_mib": 6.0, "trial_ms": [18.63, 21.05]}
    assert prefetch_summary(timed) == (
        "; prefetch off (timed: 18.6 ms per step without, 21.1 with)"
    )
    low = {"policy": "timed", "on": False, "need_mib": 1.06, "trial_ms": None}
    assert (
        prefetch_summary(low) == "; prefetch off (the steps need 1.06 MiB per layer from the host)"
    )
    assert prefetch_summary(None) == "" and prefetch_summary({**timed, "policy": "always"}) == ""


def test_forecast_prefetch_is_timed_unless_asked_always():
    """--forecast prefetches under the "timed" policy (engine.kv.prefetch_policy) unless
    --prefetch always says otherwise."""
    from agentctx.engine_options import engine_config

    assert engine_config("2%", None, None, kv_dtype="fp8").kv_dtype == "fp8"
    assert engine_config("2%", None, None).kv_dtype == "auto"
    timed = engine_config("2%", None, None, forecast="free")
    always = engine_config("2%", None, None, forecast="free", prefetch="always")
    assert timed.sparse.prefetch_policy == "timed" and timed.sparse.forecast == "free"
    assert always.sparse.prefetch_policy == "always"


@pytest.mark.parametrize("args,needle", [
    (["--sparse", "lots"], "Invalid value for --sparse"),
    (["--sparse", "150%"], "budget_fraction must be in (0, 1]"),
    (["--gpu-kv-budget", "2GB"], "a GPU KV budget needs --sparse"),
    (["--forecast", "free"], "Forecast prefetch needs --sparse"),
    (["--kv-dtype", "fp8"], "fp8 KV is for the tiered cache: it needs --sparse"),
    (["--sparse", "2%", "--kv-dtype", "int3"], "Invalid value for '--kv-dtype'"),
    (["--sparse", "2%", "--forecast", "psychic"], "Invalid value for '--forecast'"),
    (["--sparse", "2%", "--gpu-kv-budget", "many"], "not a size"),
    (["--speculate", "psychic"], "Invalid value for --speculate"),
    (["--speculate", "draft:"], "draft: needs a model path"),
])  # fmt: skip
def test_bad_kv_options_are_usage_errors(args, needle):
    result = agentctx("ask", "hi", *args)
    assert result.returncode == 2 and needle in result.stderr and "Traceback" not in result.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_speculation_reports_its_acceptance(small_repo):
    """The default (auto: prompt lookup) drafts from the packed files when the answer
    quotes them; the usage record says how many tokens each verification gave."""
    result = agentctx(
        "ask", "Print the file calc.py exactly as it is.", "--repo", str(small_repo), "--no-save",
        "--max-tokens", "40", "--json", "--weights", "dense",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    usage = json.loads(result.stdout.strip().splitlines()[-1])
    spec = usage["speculation"]
    assert spec["steps"] > 0 and spec["mean_accepted"] >= 1.0
    off = agentctx("ask", "hi", "--repo", str(small_repo), "--no-save", "--max-tokens", "4",
                   "--json", "--speculate", "off")  # fmt: skip
    assert off.returncode == 0 and "speculation" not in off.stdout.strip().splitlines()[-1]


def test_draft_model_that_does_not_exist_is_one_clear_line(small_repo):
    result = agentctx("ask", "hi", "--repo", str(small_repo), "--speculate", "draft:/no/model")
    assert_one_line_error(result, "/no/model")


def test_host_kv_budget_beyond_memory_is_one_clear_line(small_repo):
    result = agentctx("ask", "hi", "--repo", str(small_repo), "--host-kv-budget", "9000GiB")
    assert_one_line_error(result, "host memory", "lower --host-kv-budget")


def test_arguments_that_are_not_utf8_are_usage_errors(tmp_path):
    bad = os.fsdecode(b"caf\xe9")  # as Python passes such bytes from argv
    for args in (("ask", bad), ("sessions", "show", bad), ("ask", "q", "--repo", bad)):
        proc = agentctx(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip() == "agentctx: error: argument b'caf\\xe9' is not valid UTF-8"


@pytest.mark.parametrize(
    "args",
    [
        ("--temperature", "nan"),
        ("--temperature", "inf"),
        ("--repeat-penalty", "nan"),
        ("--sparse", "0"),
        ("--sparse", "-5"),
        ("--sparse", "99999999999999999999999"),
        ("--host-kv-budget", "1e999"),
        ("--repo", ""),
    ],
)
def test_out_of_range_numbers_are_usage_errors(args):
    proc = agentctx("ask", "q", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("device, needle", [("tpu", "unknown device"), ("meta", "not supported")])
def test_bad_device_is_one_clear_line(small_repo, device, needle):
    proc = agentctx("ask", "q", "--repo", str(small_repo), "--no-save", "--device", device)
    assert_one_line_error(proc, needle)


def test_host_kv_budget_beyond_memory_fails_fast(small_repo):
    # 1e14 bytes: the pool's size is checked before anything lists its pages (this took
    # minutes and GiBs of memory)
    proc = agentctx("ask", "q", "--repo", str(small_repo), "--no-save", "--host-kv-budget",
                    "1e14", timeout=60)  # fmt: skip
    assert_one_line_error(proc, "lower --host-kv-budget")


def test_gpu_tier_too_small_for_the_question_fails_before_answering(small_repo):
    proc = agentctx("ask", "What does add do?", "--repo", str(small_repo), "--no-save",
                    "--sparse", "2%", "--gpu-kv-budget", "1")  # fmt: skip
    assert_one_line_error(proc, "GPU KV budget holds 1 pages")
    assert proc.stdout == ""  # nothing of an answer was printed


def test_output_that_cannot_be_written_is_one_clear_line():
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "agentctx", "models"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "agentctx: error: No space left on device"
    read, write = os.pipe()
    os.close(read)  # a reader that is gone: `agentctx models | head -0`
    proc = subprocess.run([sys.executable, "-m", "agentctx", "models"], stdout=write,
                          stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    os.close(write)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr


@pytest.mark.parametrize(
    "text, needle",
    [('{"models": 5}', '"models" must be a list'), ("[1]", "not a JSON object"),
     ("[" * 100000, "cannot read config"), (b'{"models": \xff}', "cannot read config")],
)  # fmt: skip
def test_bad_config_file_is_one_clear_line(tmp_path, text, needle):
    home = tmp_path / "home"
    home.mkdir()
    data = text if isinstance(text, bytes) else text.encode()
    (home / "config.json").write_bytes(data)
    proc = agentctx("models", env={"AGENTCTX_HOME": str(home)})
    assert_one_line_error(proc, needle)


def test_checkpoint_config_that_is_not_an_object(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("[1, 2]")
    proc = agentctx("ask", "q", "--repo", str(tmp_path), "--no-save", "--model", str(ckpt))
    assert_one_line_error(proc, "not a JSON object")


def test_a_closed_stdout_is_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "agentctx", "models"], stderr=subprocess.PIPE,
                          text=True, timeout=120, preexec_fn=lambda: os.close(1))  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr


def test_another_kernels_package_first_on_the_path_is_one_line(small_repo, tmp_path):
    """Hugging Face's `kernels` distribution (required by transformers >= 5.25) installs a
    top-level `kernels` that takes the place of this project's: named, with the way out."""
    shadow = tmp_path / "shadow" / "kernels"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('"""another distribution\'s kernels"""\n')
    env = {**os.environ, "PYTHONPATH": str(shadow.parent)}
    proc = subprocess.run([sys.executable, "-m", "agentctx", "ask", "what is this?"],
                          cwd=small_repo, capture_output=True, text=True, timeout=300,
                          env=env)  # fmt: skip
    assert_one_line_error(proc, str(shadow), "pip uninstall kernels")
