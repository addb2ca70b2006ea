"""typer, without the two rich modules its help imports and this CLI never uses.

typer's help formatter (`typer.rich_utils`) imports `rich.markdown` (which pulls in
markdown-it: ~50 ms, a third of `diagnose --help`) and `rich.traceback` (~25 ms) at its top.
This app formats help in rich markup mode, never markdown, and turns pretty exceptions off,
so neither is called. Each is registered as a stand-in module whose classes import the real
module on first use and hand over to it; the real module then replaces the stand-in in
`sys.modules`, so any later import gets the real one.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


def _real(name: str) -> types.ModuleType:
    if isinstance(sys.modules.get(name), _StandIn):
        del sys.modules[name]
    return importlib.import_module(name)


class _StandIn(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:  # any other name: the real module's
        if attr.startswith("__"):  # the import system asks for `__path__` and the like
            raise AttributeError(attr)
        return getattr(_real(self.__name__), attr)


def _stand_in_class(module: str, name: str) -> type:
    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        return getattr(_real(module), name)(*args, **kwargs)

    class Meta(type):
        def __getattr__(cls, attr: str) -> Any:  # Traceback.from_exception and the like
            if attr.startswith("__"):  # typing asks `Markdown | Text` for its dunders at def time
                raise AttributeError(attr)
            return getattr(getattr(_real(module), name), attr)

    return Meta(name, (), {"__new__": __new__, "__module__": module})


def _defer(module: str, *names: str) -> None:
    if module in sys.modules:
        return  # already imported for real: nothing to save
    stand_in = _StandIn(module)
    for name in names:
        setattr(stand_in, name, _stand_in_class(module, name))
    sys.modules[module] = stand_in


_defer("rich.markdown", "Markdown")
_defer("rich.traceback", "Traceback")

import typer  # noqa: E402 - after the stand-ins, so that its help formatter finds them

__all__ = ["typer"]
