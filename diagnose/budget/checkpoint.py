"""The checkpoint's own size: exact weight bytes when its files are at hand.

`model.safetensors.index.json` states `metadata.total_size`; without an index (one-file
checkpoints) each `*.safetensors` header says the byte range of every tensor (8 bytes of
little-endian header length, then a JSON header: {name: {dtype, shape, data_offsets}}).
Only headers are read, never the tensors. The config arithmetic stays the fallback.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from ..base.errors import InputError

HEADER_MAX = 100 * 1024 * 1024  # safetensors caps its header at 100 MB


class CheckpointError(InputError):
    pass


def checkpoint_bytes(where: str) -> tuple[int, str] | None:
    """(bytes, how they were found) for a model directory (or a file in it), None when it holds
    neither an index nor safetensors files. A file that is there but broken is an error."""
    p = Path(where)
    d = p if p.is_dir() else p.parent
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
            total = data["metadata"]["total_size"]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: no metadata.total_size ({type(e).__name__}: {e})") from None
        if isinstance(total, bool) or not isinstance(total, (int, float)) or total <= 0:
            raise CheckpointError(f"{index}: metadata.total_size is {total!r}: a positive byte count")
        return int(total), f"{index.name} (metadata.total_size)"
    files = sorted(d.glob("*.safetensors"))
    if not files:
        return None
    return sum(_tensor_bytes(f) for f in files), f"the headers of {len(files)} safetensors file(s)"


def _tensor_bytes(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: too short for a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if not 0 < n <= HEADER_MAX:
                raise CheckpointError(f"{path}: header length {n} is not a safetensors header")
            header = json.loads(f.read(n))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{path}: the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the header is not a JSON object")
    total = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = t["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name!r} has no data_offsets") from None
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end):
            raise CheckpointError(f"{path}: tensor {name!r} has data_offsets {t['data_offsets']!r}")
        total += end - start
    return total
