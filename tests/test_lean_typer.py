"""lean_typer: typer's help formatter loads without markdown-it or rich.traceback, and both
still work, as the real modules, the moment anything uses them."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import diagnose.cli.main
from typer import rich_utils
loaded_at_import = [m for m in ("markdown_it", "rich.pretty", "rich.syntax") if m in sys.modules]
{body}
"""


def _run(body: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body)], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_help_formatter_imports_neither_markdown_it_nor_rich_traceback() -> None:
    assert (
        _run(
            "print(loaded_at_import, 'rich.traceback' in sys.modules and "
            "type(sys.modules['rich.traceback']).__name__)"
        )
        == "[] _StandIn"
    )


def test_a_stand_in_class_builds_the_real_object_and_hands_the_module_over() -> None:
    body = """
from rich.console import Console
md = rich_utils.Markdown("**bold**")
import rich.markdown
print(type(md).__module__, type(md).__name__, type(sys.modules["rich.markdown"]).__name__)
c = Console(width=40, file=open("/dev/null", "w"))
c.print(md)
print(isinstance(md, rich.markdown.Markdown))
"""
    assert _run(body).splitlines() == ["rich.markdown Markdown module", "True"]


def test_a_class_method_of_the_stand_in_reaches_the_real_class() -> None:
    body = """
try:
    1 / 0
except ZeroDivisionError as e:
    tb = rich_utils.Traceback.from_exception(type(e), e, e.__traceback__)
print(type(tb).__module__, "markdown_it" in sys.modules)
"""
    assert _run(body) == "rich.traceback False"


def test_help_is_whole_with_the_stand_ins() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "diagnose", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in ("scan", "watch", "run", "probe", "plan", "rules", "kb"):
        assert f" {command} " in out
