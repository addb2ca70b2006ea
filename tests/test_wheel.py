"""The built wheel carries its rules: the installed tool works outside the source tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from .conftest import FIXTURES, ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    p = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if p.returncode != 0:
        pytest.fail(f"wheel build failed: {p.stderr[-2000:]}")
    return next(out.glob("diagnose_llm-*.whl"))


def test_wheel_contains_rules(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "diagnose/rules/memory.yaml" in names and "diagnose/rules/engines/vllm.yaml" in names


def test_installed_wheel_runs_outside_the_tree(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    log = FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log"
    p = subprocess.run(
        [sys.executable, "-c", "import diagnose, sys; print(diagnose.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert p.stdout.startswith(str(target))
    p = subprocess.run(
        [sys.executable, "-m", "diagnose", "scan", "--json", str(log)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1, p.stderr
    assert json.loads(p.stdout)["primary"]["rule"] == "vllm.kv-cache-too-small.v1"
