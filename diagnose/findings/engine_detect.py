"""Which engine wrote the log (and its variant, version and platform), from what its markers
found, unless the user forced one.
"""

from __future__ import annotations

from ..match.scanner import ScanResult
from ..model.records import EngineInfo

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any


def detect_engine(result: ScanResult, forced: str | None) -> EngineInfo:
    if forced:
        info = EngineInfo(name=forced, reason="forced with --engine")
    elif result.engine_scores:
        name, _score = max(result.engine_scores.items(), key=lambda kv: kv[1])
        info = EngineInfo(name=name, reason=result.engine_reason.get(name))
    else:
        info = EngineInfo(name="generic", reason="no engine-specific line found")
    own = {k.partition("/")[2]: v for k, v in result.variant_scores.items() if k.startswith(info.name + "/")}
    if own:
        info.variant = max(own.items(), key=lambda kv: kv[1])[0] or None
    info.version = result.version
    said = (result.observed.get(k) for k in PLATFORM_KEYS)
    info.platform = next((p for p in map(platform_of, said) if p), None)
    return info


# what logs call a platform → one name per platform (the allocator says HIP on ROCm)
_PLATFORMS = {
    "cuda": "cuda",
    "hip": "rocm",
    "rocm": "rocm",
    "npu": "npu",
    "ascend": "npu",
    "xpu": "xpu",
    "mps": "mps",
    "metal": "metal",
    "vulkan": "vulkan",
    "sycl": "sycl",
    "cpu": "cpu",
    "tpu": "tpu",
    "musa": "musa",
    "cann": "npu",
}


PLATFORM_KEYS = (
    "platform_alloc",
    "platform_mps",
    "platform_ggml",
    "platform_ggml_buffer",
    "platform_backend",
    "platform_plugin",
    "platform",
)


def platform_of(said: Any) -> str | None:
    return _PLATFORMS.get(str(said).lower()) if said else None
