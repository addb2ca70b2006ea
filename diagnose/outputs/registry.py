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
    name: str, diagnoses: list[Diagnosis], several: bool = False, show_all: bool = False, chart: bool = False
) -> None:
    """Print the diagnoses in the named output (`several`: as the answer for several logs)."""
    out = OUTPUTS[name]
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
