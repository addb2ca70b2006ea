"""The outputs of a diagnosis, one registry: a command picks one by name and `emit` prints it.
A renderer is a module with `render(d, show_all, chart)`, imported only when chosen (a JSON
scan loads no text renderer); an output is added here and in its module, nowhere else."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..model.records import Diagnosis


@dataclass(slots=True)
class Output:
    """One output a command may print."""

    name: str
    module: str  # diagnose.outputs.<module>.render(d, show_all, chart)
    between: str  # between the diagnoses of several logs
    opening: str = ""  # around several (a JSON array)
    closing: str = ""
    styled: bool = False  # rich's styled lines: colour on a terminal, plain on a pipe


OUTPUTS = {
    o.name: o
    for o in (
        Output("text", "text", "\n", styled=True),
        Output("json", "json_report", ",\n", "[", "]"),
        Output("markdown", "markdown", "\n\n---\n\n"),
    )
}


def emit(
    name: str,
    diagnoses: list[Diagnosis],
    several: bool = False,
    show_all: bool = False,
    chart: bool = False,
    unreadable: list[tuple[int, str, str]] | None = None,
) -> None:
    """Print the diagnoses in the named output (`several`: as the answer for several logs).
    `unreadable`: (position, file, why) of the logs that could not be read; in JSON each keeps
    its place in the array as an error object, so positions follow the arguments."""
    out = OUTPUTS[name]
    if name == "json" and several and unreadable:
        import json

        render = import_module(f"diagnose.outputs.{out.module}").render
        items = [render(d, show_all, chart) for d in diagnoses]
        for pos, source, why in sorted(unreadable):
            error = {"schema": 1, "source": source, "status": "error", "error": why}
            items.insert(pos, json.dumps(error, indent=2, ensure_ascii=False))
        print(f"{out.opening}{out.between.join(items)}{out.closing}")
        return
    render = import_module(f"diagnose.outputs.{out.module}").render
    if out.styled:
        from .styled import print_styled

        for i, d in enumerate(diagnoses):
            if i:
                print(out.between, end="")
            print_styled(render(d, show_all, chart))
        return
    body = out.between.join(render(d, show_all, chart) for d in diagnoses)
    print(f"{out.opening}{body}{out.closing}" if several else body)
