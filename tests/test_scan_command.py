"""The fast `scan` path (no typer) against the typer command it stands in for."""

from __future__ import annotations

import io
import json
import sys

import pytest

from diagnose.cli.fast_scan import SCAN_OPTIONS, read_scan_argv

from .conftest import FIXTURES, run

TYPER_CLI = [
    sys.executable,
    "-c",
    "import sys; sys.argv[0] = 'diagnose'; from diagnose.cli.main import main; main()",
]
OOM_LOG = str(FIXTURES / "logs/vllm/oom-runtime-v1-fragmented.log")


def test_fast_options_are_the_typer_commands_options():
    import typer.main

    from diagnose.cli.main import app

    scan = typer.main.get_command(app).commands["scan"]  # type: ignore[attr-defined]
    declared = {}
    for p in scan.params:
        if p.param_type_name != "option" or "--help" in p.opts:
            continue
        kind = "flag" if p.is_flag else "multi" if p.multiple else "value"
        for name in p.opts:
            declared[name] = (p.name, kind)
    assert {k: v[1] for k, v in SCAN_OPTIONS.items()} == {k: v[1] for k, v in declared.items()}
    # the keyword each option fills is the typer parameter of the same name
    assert {k: v[0] for k, v in SCAN_OPTIONS.items()} == {k: v[0] for k, v in declared.items()}


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["a.log"], {"files": ["a.log"]}),
        (["a.log", "--json", "b.log"], {"files": ["a.log", "b.log"], "json_out": True}),
        (["--format=markdown", "a.log"], {"files": ["a.log"], "fmt": "markdown"}),
        (["--format", "json", "-"], {"files": ["-"], "fmt": "json"}),
        (["--rules", "r1", "--rules=r2", "a.log"], {"files": ["a.log"], "rules": ["r1", "r2"]}),
        (["--engine", "sglang", "--engine", "tgi", "a"], {"files": ["a"], "engine": "tgi"}),
        (
            ["--gpus", "smi.txt", "--config", "c.json", "--kb", "k", "--all", "x"],
            {"files": ["x"], "gpus": "smi.txt", "config": "c.json", "kb": ["k"], "show_all": True},
        ),
    ],
)
def test_read_scan_argv(argv, expect):
    base = {"files": [], "fmt": "text", "json_out": False, "show_all": False}
    assert read_scan_argv(argv) == {**base, **expect}


@pytest.mark.parametrize(
    "argv",
    [
        ["--help", "a.log"],
        ["-h"],
        ["--jsn", "a.log"],
        ["--json=yes", "a.log"],
        ["--format", "yaml", "a.log"],
        ["a.log", "--rules"],
        ["--gpus", "--json", "a.log"],
        ["--", "a.log"],
    ],
)
def test_anything_doubtful_goes_to_the_full_cli(argv):
    assert read_scan_argv(argv) is None


@pytest.mark.parametrize(
    "args",
    [
        [OOM_LOG],
        ["--json", OOM_LOG],
        ["--format=markdown", OOM_LOG],
        ["--all", "--engine", "generic", str(FIXTURES / "logs/sglang/port-in-use.log")],
        [str(FIXTURES / "logs/tgi/healthy-connected.log")],
        [str(FIXTURES / "logs/tgi")],  # a directory: the same one-line error
    ],
)
def test_fast_and_typer_paths_print_the_same(cli, args):
    fast = run([*cli, "scan", *args])
    full = run([*TYPER_CLI, "scan", *args])
    assert (fast.returncode, fast.stdout, fast.stderr) == (full.returncode, full.stdout, full.stderr)


def test_usage_errors_read_the_same_on_both_paths(cli):
    for args in (["--engine", "nope", OOM_LOG], ["--format", "yaml", OOM_LOG], ["--bogus"]):
        fast = run([*cli, "scan", *args])
        full = run([*TYPER_CLI, "scan", *args])
        assert fast.returncode == full.returncode == 2
        assert fast.stderr == full.stderr


HEAVY = {
    "typer",
    "click",
    "pydantic",
    "rich",
    "pyparsing",
    "yaml",
    "regex",
    "pathlib",
    "typing",
}


def test_plain_scan_imports_none_of_the_heavy_modules(tmp_path):
    """What a cold start must not pay for (bench/README.md has the figures), beyond what the
    interpreter itself loads here."""
    code = (
        "import sys\n"
        "before = {m.split('.')[0] for m in sys.modules}\n"
        f"sys.argv = ['diagnose', 'scan', {OOM_LOG!r}]\n"
        "from diagnose.entry import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(sorted(({{m.split('.')[0] for m in sys.modules}} - before) & {HEAVY!r}), file=sys.stderr)\n"
    )
    env = {"DIAGNOSE_CACHE": str(tmp_path)}
    run([sys.executable, "-c", code], env=env)  # the first run fills the cache (and needs yaml)
    r = run([sys.executable, "-c", code], env=env)
    assert r.stderr.decode().strip().splitlines()[-1] == "[]"


def test_plain_text_is_what_rich_prints_without_a_terminal():
    from rich.console import Console

    from diagnose.outputs.styled import print_styled
    from diagnose.outputs.text import render_text
    from diagnose.pipeline.scan import scan_paths

    d = scan_paths([OOM_LOG])
    out = render_text(d, show_all=True)
    buf = io.StringIO()
    print_styled(out, Console(file=buf, highlight=False, soft_wrap=True, force_terminal=False))
    assert buf.getvalue() == out.plain()
    assert "next change" in out.plain()


def test_json_of_the_fast_path_is_schema_1(cli):
    doc = json.loads(run([*cli, "scan", "--json", OOM_LOG]).stdout)
    assert doc["schema"] == 1


def test_colour_only_when_asked_for_on_a_pipe(cli):
    plain = run([*cli, "scan", OOM_LOG], env={"NO_COLOR": "", "FORCE_COLOR": ""})
    forced = run([*cli, "scan", OOM_LOG], env={"NO_COLOR": "", "FORCE_COLOR": "1"})
    assert b"\x1b[" not in plain.stdout and b"\x1b[" in forced.stdout
    assert forced.returncode == plain.returncode == 1
