"""The inputs of a budget: a model's config.json (size-capped, its quantisation checked and
hf_quant_config.json merged), a GPU spec such as `4x80`, and the checkpoint's own quantisation.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ..base.errors import InputError


class ConfigError(InputError):
    pass


CONFIG_MAX_BYTES = 16 << 20  # the largest config.json a model ships is tens of KiB


def load_config(path: str) -> dict[str, Any]:
    p = Path(path)
    if p.suffix.lower() == ".gguf" and p.is_file():
        from .gguf import config_from_gguf

        return config_from_gguf(str(p))  # Ollama's and llama.cpp's own files
    if p.is_dir():
        p = p / "config.json"
    if p.exists() and not p.is_file():
        raise ConfigError(f"{p}: not a regular file (give config.json or the model directory)")
    try:
        with open(p, "rb") as f:
            raw = f.read(CONFIG_MAX_BYTES + 1)
        if len(raw) > CONFIG_MAX_BYTES:
            raise ConfigError(f"{p}: over {CONFIG_MAX_BYTES >> 20} MiB: not a model's config.json")
        data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file (give config.json or the model directory)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply to be a model's config.json") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a config.json is a JSON object")
    data["__path__"] = str(p)
    _merge_hf_quant(data, p.parent / "hf_quant_config.json")
    return data


def check_quantization(q: Any, path: str) -> None:
    """The quantisation block's numbers are numbers (`bits: "four"` is a broken file, not a
    4-bit model): GPTQ's `bits` and `group_size` (-1 for one group), AWQ's `w_bit` and
    `q_group_size`."""
    if q is None:
        return
    if not isinstance(q, dict):
        raise ConfigError(f"{path}: field 'quantization_config' is {q!r}: it must be a JSON object")
    for k, low, high in (
        ("bits", 1, 16),
        ("w_bit", 1, 16),
        ("group_size", -1, 1 << 20),
        ("q_group_size", -1, 1 << 20),
    ):
        v = q.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high or v == 0:
            raise ConfigError(
                f"{path}: field 'quantization_config.{k}' is {v!r}: it must be a whole number from {low} to {high}"
            )


def _merge_hf_quant(cfg: dict[str, Any], beside: Path) -> None:
    """NVIDIA ModelOpt checkpoints keep their quantisation in hf_quant_config.json beside
    config.json ({"quantization": {"quant_algo": "NVFP4", "exclude_modules": [...]}}): read it
    as the quantization_config when config.json has none."""
    if cfg.get("quantization_config") or not beside.is_file():
        return
    try:
        with open(beside, encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{beside}: cannot read: {e}") from None
    q = hf.get("quantization") if isinstance(hf, dict) else None
    if not isinstance(q, dict):
        raise ConfigError(f"{beside}: field 'quantization' missing: not a ModelOpt quant config")
    cfg["quantization_config"] = {"quant_method": "modelopt", **q}


_GPUS_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+(?:\.\d+)?)\s*(?:G(?:i)?B?)?\s*$")


# what a user meant as NxGIB when it is not a file: digits, an x, something number-like
_GPUS_LIKE = re.compile(r"^\s*[-+]?[\d.e+-]*\s*[xX×]\s*[-+]?[\d.eE+-]+\s*(?:G(?:i)?B?)?\s*$")


def parse_gpus_spec(spec: str) -> tuple[int, float] | None:
    """`2x80` → (2, 80.0): two GPUs of 80 GiB. None when it is not that form; an InputError
    when it is, with a count or size that cannot be (0x80, 2x0, 2x-80, 1x1e400)."""
    m = _GPUS_RE.match(spec)
    if not m:
        if _GPUS_LIKE.match(spec) and not os.path.exists(spec):
            raise ConfigError(f"--gpus {spec}: give N×GiB as two positive numbers, e.g. 2x80")
        return None
    n, gib = int(m.group(1)), float(m.group(2))
    if n < 1 or n > 4096:
        raise ConfigError(f"--gpus {spec}: the GPU count must be between 1 and 4096")
    if not 0 < gib <= 4096:
        raise ConfigError(f"--gpus {spec}: the memory per GPU must be between 0 and 4096 GiB")
    return n, gib


def checkpoint_quant(cfg: dict[str, Any]) -> str | None:
    """The quantisation the checkpoint itself carries (config.json's quantization_config)."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    q = cfg.get("quantization_config") or text.get("quantization_config") or {}
    m = q.get("quant_method") if isinstance(q, dict) else None
    return str(m).lower() if m else None


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HF_CACHE = re.compile(r"models--([^/]+)--([^/]+)/snapshots/[^/]+/?$")


def model_id(cfg: dict[str, Any], given: str) -> str | None:
    """What a launch line names the model by: the GGUF file; the checkpoint's directory when the
    weights lie beside config.json (a hub cache's `models--ORG--NAME` as ORG/NAME); else the
    hub id config.json names (`_name_or_path`, when it is one); None for a bare config file."""
    path = Path(str(cfg.get("__path__") or given))
    if path.suffix.lower() == ".gguf":
        return given
    folder = path.parent
    cached = _HF_CACHE.search(folder.resolve().as_posix())
    if cached:
        return f"{cached.group(1)}/{cached.group(2)}"
    weights = (folder / "model.safetensors.index.json").is_file() or any(folder.glob("*.safetensors"))
    if path.name == "config.json" and weights:
        shown = given[: -len("config.json")].rstrip("/") if given.endswith("config.json") else given
        return shown or "."
    named = cfg.get("_name_or_path")
    return named if isinstance(named, str) and _HUB_ID.match(named) else None
