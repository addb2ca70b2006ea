"""A GGUF file's header as a model config: what Ollama and llama.cpp load.

GGUF (llama.cpp's format, versions 2 and 3): magic `GGUF`, version, tensor count, metadata
key/value count, the key/values (`general.architecture`, `<arch>.block_count`, …), then one
info per tensor (name, shape, type, offset into the data). Only the header is read — a few
MB at most, the token list skipped by its lengths — never the tensors. The tensors' offsets
give each one's exact size, so the weights per layer, the token embeddings and the output
layer are what the file holds.
"""

from __future__ import annotations

import os
import struct

from ..base.errors import InputError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO

MAGIC = b"GGUF"
# value types: size of a scalar, or None (string 8, array 9)
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
# general.file_type → the names `plan --quantization` takes (llama.cpp's llama_ftype)
FILE_TYPES = {
    0: "f32",
    1: "f16",
    2: "q4_0",
    7: "q8_0",
    10: "q2_k",
    12: "q3_k_m",
    14: "q4_k_m",  # Q4_K_S: close enough in bits a weight
    15: "q4_k_m",
    16: "q5_k_m",
    17: "q5_k_m",
    18: "q6_k",
    25: "iq4_nl",
    26: "iq3_s",
    27: "iq3_m",
    29: "iq2_m",
    30: "iq4_xs",
    32: "f16",  # BF16: two bytes too
}
MAX_STRING = 1 << 24  # a header string longer than 16 MB is a broken file


class GGUFError(InputError):
    pass


class _Reader:
    def __init__(self, f: BinaryIO, path: str):
        self.f, self.path = f, path

    def read(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise GGUFError(f"{self.path}: the GGUF header ends early (truncated file?)")
        return b

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > MAX_STRING:
            raise GGUFError(f"{self.path}: a header string of {n} bytes: not a GGUF file this tool can read")
        return self.read(n).decode("utf-8", "replace")

    def value(self, vtype: int, keep: bool = True) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == 8:
            return self.string() if keep else self._skip_string()
        if vtype == 9:
            inner, count = self.scalar("<I"), self.scalar("<Q")
            if inner in _SCALARS and inner != 8:
                size = struct.calcsize(_SCALARS[inner])
                if not keep or count > 4096:
                    self.f.seek(size * count, 1)  # token scores, types: only their count matters
                    return count
                return [self.scalar(_SCALARS[inner]) for _ in range(count)]
            for _ in range(count):
                self.value(inner, keep=False)
            return count  # the token list: its length is the vocabulary
        raise GGUFError(f"{self.path}: unknown GGUF value type {vtype}")

    def _skip_string(self) -> None:
        n = self.scalar("<Q")
        if n > MAX_STRING:
            raise GGUFError(f"{self.path}: a header string of {n} bytes: not a GGUF file this tool can read")
        self.f.seek(n, 1)


def read_gguf(path: str) -> dict[str, Any]:
    """The header: {"meta": {key: value}, "tensors": {name: bytes}, "size": file bytes}."""
    try:
        size = os.path.getsize(path)
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as e:
        raise GGUFError(f"{path}: cannot read: {e.strerror or e}") from None
    with f:
        r = _Reader(f, path)
        if r.read(4) != MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (no GGUF magic)")
        version = r.scalar("<I")
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version}: only versions 2 and 3 are read")
        n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.scalar("<I"))
        infos: list[tuple[str, int]] = []
        for _ in range(n_tensors):
            name = r.string()
            dims = r.scalar("<I")
            f.seek(8 * dims + 4, 1)  # the shape and the type: sizes come from the offsets
            infos.append((name, r.scalar("<Q")))
        align = meta.get("general.alignment", 32)
        if isinstance(align, bool) or not isinstance(align, int) or align < 1 or align & (align - 1):
            raise GGUFError(f"{path}: field 'general.alignment' is {align!r}: it must be a power of two")
        start = -(-f.tell() // align) * align
    ends = sorted({off for _, off in infos} | {size - start})
    from itertools import pairwise

    nxt = dict(pairwise(ends))
    tensors = {name: nxt.get(off, 0) - off for name, off in infos}
    return {"meta": meta, "tensors": tensors, "size": size}


def config_from_gguf(path: str) -> dict[str, Any]:
    """A config.json-like dict from the header, with the file's exact bytes (whole, per layer,
    embeddings, output) and its quantisation."""
    h = read_gguf(path)
    meta, tensors = h["meta"], h["tensors"]
    arch = str(meta.get("general.architecture") or "")
    if not arch:
        raise GGUFError(f"{path}: no general.architecture in the GGUF header")

    def a(key: str, default: Any = None) -> Any:
        v = meta.get(f"{arch}.{key}", default)
        return max(v) if isinstance(v, list) and v else v  # per-layer lists (some MoE, SWA)

    heads = a("attention.head_count")
    hidden = a("embedding_length")
    layers = a("block_count")
    if not (heads and hidden and layers):
        raise GGUFError(
            f"{path}: the header lacks {arch}.block_count / embedding_length / attention.head_count"
        )
    if not all(isinstance(x, int) and 0 < x < 1_000_000 for x in (heads, hidden, layers)):
        raise GGUFError(f"{path}: {arch}.block_count / embedding_length / attention.head_count out of range")
    vocab = meta.get("tokenizer.ggml.tokens") or a("vocab_size")
    cfg: dict[str, Any] = {
        "model_type": arch,
        "_name_or_path": str(meta.get("general.name") or os.path.basename(path)),
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": a("attention.head_count_kv", heads),
        "head_dim": a("attention.key_length", hidden // heads),
        "intermediate_size": a("feed_forward_length", 4 * hidden),
        "vocab_size": int(vocab) if vocab else 32000,
        "max_position_embeddings": a("context_length"),
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": "float16",
    }
    if a("expert_count"):
        cfg["num_experts"] = a("expert_count")
        cfg["num_experts_per_tok"] = a("expert_used_count", 1)
        cfg["moe_intermediate_size"] = a("expert_feed_forward_length", cfg["intermediate_size"])
    if a("attention.sliding_window"):
        cfg["sliding_window"] = a("attention.sliding_window")
    if a("attention.kv_lora_rank"):
        cfg["kv_lora_rank"] = a("attention.kv_lora_rank")
        cfg["qk_rope_head_dim"] = a("rope.dimension_count", 64)
    per_layer = [0] * int(layers)
    for name, n in tensors.items():
        if name.startswith("blk."):
            i = name.split(".", 2)[1]
            if i.isdigit() and int(i) < len(per_layer):
                per_layer[int(i)] += n
    ftype = meta.get("general.file_type")
    cfg["__gguf__"] = {
        "bytes": sum(tensors.values()),
        "layer_bytes": per_layer,
        "embed_bytes": tensors.get("token_embd.weight", 0),
        "output_bytes": tensors.get("output.weight", tensors.get("token_embd.weight", 0)),
        "file_type": FILE_TYPES.get(int(ftype)) if isinstance(ftype, int) else None,
    }
    cfg["__path__"] = path
    return cfg
