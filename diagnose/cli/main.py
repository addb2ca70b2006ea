"""The command line's entry: every command group registered, a piped log with no command read as
`scan -`, and click's errors said as one line.
"""

import sys

from ..base.errors import (
    EXIT_OK,
    EXIT_USAGE,
    run_guarded,
    say_error,
)
from .app import Format, app
from .lean_typer import typer

# every command group registers on the app as it is imported, in the order `--help` lists them
from .scan_cmd import scan

# isort: split
from . import fleet_cmd  # noqa: F401

# isort: split
from . import live_cmd  # noqa: F401

# isort: split
from . import probe_cmd  # noqa: F401

# isort: split
from . import kb_cmd  # noqa: F401

# isort: split
from . import plan_cmd  # noqa: F401

# isort: split
from . import rules_cmd  # noqa: F401

# an example under each command's help (its epilog): what a first try looks like
EXAMPLES = {
    "scan": "diagnose scan serve.log  ·  vllm serve MODEL 2>&1 | diagnose  ·  diagnose scan --json a.log b.log",
    "device": "diagnose device smi.txt --tp 4  (no file: runs nvidia-smi)",
    "stream": "kubectl logs -n llm -l app=vllm --prefix | diagnose stream --events failed,closed",
    "k8s": "diagnose k8s -n llm -l app=vllm",
    "watch": "diagnose watch serve.log --follow  ·  diagnose watch --glob '/var/log/pods/*/*/*.log'",
    "run": "diagnose run --log serve.log -- vllm serve MODEL --tensor-parallel-size 2",
    "probe": "diagnose probe http://127.0.0.1:8000  ·  diagnose probe URL --sweep 1,2,4,8",
    "plan": "diagnose plan --config MODEL_DIR --gpus 1x24  (no --max-model-len: the longest that fits)",
    "check": "diagnose check --gpus smi.txt --config MODEL_DIR -- vllm serve MODEL -tp 3",
    "rules list": "diagnose rules list",
    "rules show": "diagnose rules show torch.oom  ·  diagnose rules show vllm",
    "rules test": "diagnose rules test serve.log",
    "kb add": 'diagnose kb add --from-log serve.log --root-cause "..." --fix "--max-model-len 32768"',
    "kb list": "diagnose kb list",
    "kb show": "diagnose kb show KB-0001",
    "kb search": "diagnose kb search 'NCCL timeout'",
    "kb export": "diagnose kb export > incidents.tar.gz",
    "kb import": "diagnose kb import incidents.tar.gz",
}
# the commands that take another command after `--`: their usage line says so
AFTER_DASHES = {"run": "[OPTIONS] -- COMMAND [ARGS]...", "check": "[OPTIONS] -- COMMAND [ARGS]..."}


def _with_examples(typer_app: typer.Typer, prefix: str = "") -> None:
    for info in typer_app.registered_commands:
        name = prefix + (info.name or (info.callback.__name__ if info.callback else ""))
        if name in EXAMPLES and not info.epilog:
            info.epilog = "Example: " + EXAMPLES[name]
        if name in AFTER_DASHES:
            info.options_metavar = AFTER_DASHES[name]
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _with_examples(group.typer_instance, f"{prefix}{group.name} ")


_with_examples(app)


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context) -> None:
    """With a log piped in and no command, `diagnose` means `diagnose scan -` (on a terminal:
    the output passed through and the verdict said live, `live.pipe`)."""
    if ctx.invoked_subcommand is None:
        if (
            sys.stdin is not None
            and not sys.stdin.isatty()
            and sys.stdout is not None
            and sys.stdout.isatty()
        ):
            # a person watching a server's pipe: its output through, the verdict live on stderr
            from ..live.pipe import tee_and_judge
            from .fast_scan import load_knowledge

            raise typer.Exit(tee_and_judge(load_knowledge(None)))
        if sys.stdin is not None and not sys.stdin.isatty():
            ctx.invoke(
                scan,
                files=["-"],
                json_out=False,
                fmt=Format.text,
                engine=None,
                rules=None,
                gpus=None,
                show_all=False,
                kb=None,
                config=None,
            )
        else:
            typer.echo(ctx.get_help())
            raise typer.Exit(EXIT_USAGE)


def _run_app() -> int:
    try:
        rc = app(standalone_mode=False)
        return rc if isinstance(rc, int) else EXIT_OK
    except typer.Exit as e:
        return int(e.exit_code)
    except typer.Abort:
        raise KeyboardInterrupt from None
    except Exception as e:
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            # click's usage errors (typer vendors click in recent releases): one line, as every
            # other error, with the command and where its help is
            ctx = getattr(e, "ctx", None)
            where = ctx.command_path if ctx is not None else "diagnose"
            say_error(f"{e.format_message()} (see `{where} -h`)")
            return EXIT_USAGE
        raise


def main() -> None:
    """The typer app, under the same error handling as the fast scan (see entry.py)."""
    run_guarded(_run_app)
