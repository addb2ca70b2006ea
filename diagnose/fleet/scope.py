"""Which sources a fleet command follows: `--include` / `--exclude` patterns, each a glob over
the source's identity (`llm/*/engine`, `*/vllm-*/*`) or over one label (`namespace=llm`,
`pod=vllm-*`, `container=engine`, `node=gpu-*`). A source is followed when it matches an
include (or none is given) and no exclude; decided once per source."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from ..base.bounded import kept
from ..base.errors import InputError

_LABEL = re.compile(r"^(namespace|pod|container|node|service|unit|key)=(.+)$")
DECIDED_MAX = 100_000  # sources remembered; beyond, the memory is started again


@dataclass
class Scope:
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    _decided: dict[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for p in [*self.include, *self.exclude]:
            if not p.strip():
                raise InputError("--include/--exclude: an empty pattern")

    @property
    def everything(self) -> bool:
        return not self.include and not self.exclude

    def follows(self, source: str, labels: dict[str, str]) -> bool:
        got = self._decided.get(source)
        if got is None:
            got = kept(
                self._decided,
                source,
                (not self.include or any(_matches(p, source, labels) for p in self.include))
                and not any(_matches(p, source, labels) for p in self.exclude),
                DECIDED_MAX,
            )
        return got


def _matches(pattern: str, source: str, labels: dict[str, str]) -> bool:
    m = _LABEL.match(pattern)
    if m:
        value = labels.get(m.group(1))
        return value is not None and fnmatch.fnmatchcase(value, m.group(2))
    return fnmatch.fnmatchcase(source, pattern)
