from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SHARED = ROOT.parent / "shared"
REAL_LOGS = SHARED / "real-logs"
REFERENCE = SHARED / "reference"


def interruptible() -> None:
    """A child's preexec_fn: Ctrl-C reaches it as a terminal would deliver it, even when this
    test run was started with SIGINT ignored (a background job of a non-interactive shell,
    `cmd &`, passes that on to every process it starts)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(cmd, stdin=None, env=None, **kw) -> subprocess.CompletedProcess[bytes]:
    """Run a command from the project root as a user would, capturing output; env adds to os.environ."""
    e = {**os.environ, **(env or {})}
    return subprocess.run(cmd, input=stdin, capture_output=True, env=e, timeout=60, cwd=ROOT, **kw)


@pytest.fixture(scope="session")
def know():
    from diagnose.knowledge.loaded import Knowledge

    return Knowledge.load()


@pytest.fixture(scope="session")
def cli() -> list[str]:
    """The installed console script (the way users run it), not the typer test runner."""
    exe = Path(sys.executable).parent / "diagnose"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("diagnose")
    if found:
        return [found]
    pytest.skip("the diagnose console script is not installed")


@pytest.fixture()
def in_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    return ROOT


def pytest_configure(config):
    import tempfile

    os.environ.setdefault("NO_COLOR", "1")
    # hermetic: never read or write the developer's own incident store
    os.environ["DIAGNOSE_KB"] = tempfile.mkdtemp(prefix="diagnose-kb-")
    os.environ["DIAGNOSE_CACHE"] = tempfile.mkdtemp(prefix="diagnose-cache-")


def profile_oom(root: str = "/x", sep: str = "/", eol: str = "\n") -> str:
    """A vLLM V0 OOM while profiling, as its traceback prints it; tests reshape it (Windows
    paths and CRLF, a paste's indent)."""
    path = sep.join([root, "vllm", "worker", "worker.py"])
    lines = [
        "Traceback (most recent call last):",
        f'  File "{path}", line 9, in determine_num_available_blocks',
        "    self.model_runner.profile_run()",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 23.65 GiB of which 1.00 GiB is free.",
    ]
    return eol.join(lines) + eol
