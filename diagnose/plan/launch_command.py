"""A launch command as `check` reads and rewrites it: the engine (its profile's command-line
marker), its parameters under canonical names, the variables set before it
(`CUDA_VISIBLE_DEVICES=1,2 vllm serve …`), and the same command with changes applied in the
engine's own flags."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from ..base.errors import InputError
from ..knowledge.engine_profiles import Profiles, flag_for

# Parameters a launch cannot give a value below 1 to, and shares of memory in (0, 1].
COUNTS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
)
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def leading_env(cmd: list[str]) -> dict[str, str]:
    """The variables assigned before the command (`env` itself skipped), as the shell sets them."""
    out: dict[str, str] = {}
    for w in cmd:
        if w == "env":
            continue
        m = _ASSIGNMENT.match(w)
        if not m:
            break
        out[m.group(1)] = m.group(2)
    return out


def engine_of_command(joined: str, profiles: Profiles) -> str | None:
    """The engine whose profile knows this command line (its `command_line` launch marker)."""
    for name, prof in sorted(profiles.by_engine.items()):
        for m in prof.markers:
            if m.what == "launch" and m.kind == "command_line" and m.search(joined):
                return name
    return None


def parse_launch(cmd: list[str], profiles: Profiles | None = None) -> tuple[str, dict[str, Any]]:
    """The engine and its parameters (canonical names) from a launch command or the generic
    engine's YAML config. One reader serves `check`, `run` and the launch lines in logs: the
    engine from its profile's command-line marker, the names from its profile."""
    from ..read.launch_args import _parse_command_line, canonical_launch

    if profiles is None:
        from ..knowledge.engine_profiles import load_profiles

        profiles = load_profiles()
    generic = profiles.get("generic")
    if len(cmd) == 1 and cmd[0].endswith((".yaml", ".yml")) and Path(cmd[0]).is_file():
        try:
            data = yaml.safe_load(Path(cmd[0]).read_text()) or {}
        except yaml.YAMLError as e:
            from ..base.errors import yaml_problem

            raise InputError(f"{cmd[0]}: not valid YAML: {yaml_problem(e)}") from None
        if not isinstance(data, dict):
            raise InputError(f"{cmd[0]}: the generic engine's config must be a mapping")
        launch = canonical_launch({str(k): v for k, v in data.items()}, generic.names)
        return "generic", _checked(launch, "generic", profiles)
    joined = " ".join(shlex.quote(w) if " " in w else w for w in cmd) if len(cmd) > 1 else cmd[0]
    engine = engine_of_command(joined, profiles)
    if engine is None:
        known = sorted(
            n for n, p in profiles.by_engine.items() if any(m.kind == "command_line" for m in p.markers)
        )
        raise InputError(
            f"{joined[:80]}: not a server launch diagnose knows (engines with a command line: "
            f"{', '.join(known)}); for the generic engine pass its YAML config"
        )
    names = {**generic.names, **profiles.get(engine).names}
    return engine, _checked(canonical_launch(_parse_command_line(joined), names), engine, profiles)


def _checked(launch: dict[str, Any], engine: str, profiles: Profiles) -> dict[str, Any]:
    """Values a server would refuse are named here, as the flag the user typed."""
    for key in COUNTS:
        v = launch.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{flag_for(profiles, engine, key)} {v}: must be a whole number of at least 1")
    util = launch.get("gpu_memory_utilization")
    if util is not None and (
        isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1
    ):
        raise InputError(
            f"{flag_for(profiles, engine, 'gpu_memory_utilization')} {util}: must be a fraction in (0, 1]"
        )
    return launch


def installed_version(profiles: Profiles, engine: str) -> str | None:
    """The engine's version as installed on this host (its profile's `memory.package`): a check
    runs where the server will."""
    from importlib.metadata import PackageNotFoundError, version

    package = profiles.get(engine).memory.get("package")
    if not package:
        return None
    try:
        return version(package)
    except (PackageNotFoundError, ValueError):
        return None


def with_changes(cmd: list[str], changes: dict[str, Any], engine: str, profiles: Profiles) -> list[str]:
    """The command with each change made in the engine's own spelling: a flag the command gives
    (under any of its names) gets the new value, others are appended; `env:NAME` changes set
    the variable before the command; actions (freeing a GPU) are not the command's."""
    prof = profiles.get(engine)
    names = {**profiles.get("generic").names, **prof.names}
    env = {k[4:]: str(v) for k, v in changes.items() if k.startswith("env:")}
    params = {k: v for k, v in changes.items() if ":" not in k}
    words = [w for w in cmd if w != "--"]
    start = 0
    while start < len(words) and (words[start] == "env" or _ASSIGNMENT.match(words[start])):
        m = _ASSIGNMENT.match(words[start])
        if m and m.group(1) in env:
            words[start] = f"{m.group(1)}={env.pop(m.group(1))}"
        start += 1
    head = [f"{k}={v}" for k, v in env.items()]
    out, done, i = words[:start], set(), start
    while i < len(words):
        w = words[i]
        key = w.lstrip("-").split("=", 1)[0].replace("-", "_") if w.startswith("-") else None
        canon = names.get(key, key) if key else None
        if canon in params:
            flag = w.split("=", 1)[0]
            out.append(f"{flag}={params[canon]}" if "=" in w else flag)
            if "=" not in w:
                out.append(str(params[canon]))
                nxt = words[i + 1] if i + 1 < len(words) else None
                i += 1 if nxt is not None and not nxt.startswith("-") else 0
            done.add(canon)
        else:
            out.append(w)
        i += 1
    for canon, value in params.items():
        if canon not in done:
            out += [flag_for(profiles, engine, canon), str(value)]
    return head + out
