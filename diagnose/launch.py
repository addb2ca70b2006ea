"""Launch parameters from the argument dumps engines print: Python literals when they are, a pyparsing grammar otherwise.

vLLM prints `args: Namespace(…)` (V0) or `non-default args: {…}` (V1) and a
`with config: model=…, tensor_parallel_size=…` line; SGLang `server_args=ServerArgs(…)`
or a dict; TGI a Rust `Args { … }` debug dump. These are reprs with nested quotes, lists,
dicts, calls and None/True: a grammar handles them where string splitting cannot.
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyparsing as pp

# Launch keys every engine may print under the canonical (vLLM) name.
CANONICAL = {
    "model",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "kv_cache_dtype",
    "quantization",
    "enforce_eager",
    "cuda_graph_max_bs",
    "enable_chunked_prefill",
    "limit_mm_per_prompt",
    "port",
    "host",
    "swap_space",
    "cpu_offload_gb",
    "dtype",
    "trust_remote_code",
    "block_size",
    "served_model_name",
    "distributed_executor_backend",
    "max_cudagraph_capture_size",
    "max_seq_len_to_capture",
    "attention_backend",
}


class _Raw(str):
    """A value the grammar kept as text (an expression it does not model)."""


@lru_cache(maxsize=1)
def _grammar() -> dict[str, pp.ParserElement]:
    import pyparsing as pp  # only when a launch dump appears: it costs ~40 ms to import

    pp.ParserElement.enable_packrat()
    value = pp.Forward()
    ident = pp.Word(pp.alphas + "_", pp.alphanums + "_.")
    string = pp.QuotedString("'", esc_char="\\", unquote_results=True) | pp.QuotedString(
        '"', esc_char="\\", unquote_results=True
    )
    number = pp.Regex(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?(?![\w.])")
    number.set_parse_action(lambda t: float(t[0]) if any(c in t[0] for c in ".eE") else int(t[0]))
    const = pp.Regex(r"(?:None|True|False|true|false|null)(?![\w.])")
    # a parse action returning None keeps the tokens, so return a one-item list
    const.set_parse_action(
        lambda t: [
            {"None": None, "null": None, "True": True, "true": True, "False": False, "false": False}[t[0]]
        ]
    )
    lp, rp, lb, rb, lc, rc = map(pp.Suppress, "()[]{}")
    colon, _comma, eq = pp.Suppress(":"), pp.Suppress(","), pp.Suppress("=")

    def seq(open_: pp.ParserElement, close: pp.ParserElement, item: pp.ParserElement) -> pp.ParserElement:
        return open_ + pp.Optional(pp.DelimitedList(item, allow_trailing_delim=True)) + close

    listv = pp.Group(seq(lb, rb, value)).set_parse_action(lambda t: [list(t[0])])
    tuplev = pp.Group(seq(lp, rp, value)).set_parse_action(lambda t: [tuple(t[0])])
    dict_item = pp.Group(value + colon + value)
    dictv = pp.Group(seq(lc, rc, dict_item)).set_parse_action(lambda t: [{_key(k): v for k, v in t[0]}])
    kwarg = pp.Group(ident + eq + value)
    call_arg = kwarg | value
    callv = (ident + pp.Group(seq(lp, rp, call_arg))).set_parse_action(
        lambda t: [
            {
                _key(k): v
                for k, v in (a if isinstance(a, pp.ParseResults) and len(a) == 2 else ("_", a) for a in t[1])
            }
        ]
    )
    # Rust Debug: Args { model_id: "x", num_shard: Some(2), … } ; Some(x) / None
    rust_field = pp.Group(ident + colon + value)
    rust_struct = (ident + pp.Group(seq(lc, rc, rust_field))).set_parse_action(
        lambda t: [{str(k): v for k, v in t[1]}]
    )
    enum_repr = pp.Regex(r"<[^<>]*>").set_parse_action(lambda t: _Raw(t[0]))
    bare = pp.Regex(r"[^,()\[\]{}\s'\"][^,()\[\]{}]*").set_parse_action(lambda t: _Raw(t[0].strip()))
    value <<= string | number | const | rust_struct | callv | dictv | listv | tuplev | enum_repr | bare
    kwargs = pp.DelimitedList(kwarg, allow_trailing_delim=True)
    return {"value": value, "kwargs": kwargs}


def _key(k: Any) -> str:
    return str(k)


def _unwrap(v: Any) -> Any:
    # Rust Some(x) parses as a call {"_": x}
    if isinstance(v, dict) and set(v) == {"_"}:
        return _unwrap(v["_"])
    if isinstance(v, _Raw):
        return str(v)
    return v


def parse_literal(kind: str, text: str) -> dict[str, Any] | None:
    """Fast path for dumps that are plain Python literals (most `non-default args: {…}` and
    many `Namespace(…)` lines): Python's own parser reads them in microseconds, where
    importing pyparsing and building the grammar costs tens of milliseconds of cold start.
    None means "not a plain literal": the grammar decides."""
    import ast

    if kind not in ("python_dict", "python_call", "python_kwargs"):
        return None
    src = f"_({text})" if kind == "python_kwargs" else text
    try:
        node = ast.parse(src, mode="eval").body
        if kind == "python_dict" and isinstance(node, ast.Dict):
            value = ast.literal_eval(node)
            return {str(k): v for k, v in value.items()}
        if kind != "python_dict" and isinstance(node, ast.Call) and not node.args:
            if any(kw.arg is None for kw in node.keywords):
                return None
            return {str(kw.arg): ast.literal_eval(kw.value) for kw in node.keywords}
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None
    return None


def parse_repr(kind: str, text: str) -> dict[str, Any]:
    """Parse one dump into a flat mapping of top-level keys. Unparseable text gives {}."""
    text = text.strip()
    fast = parse_literal(kind, text)
    if fast is not None:
        return fast
    return parse_with_grammar(kind, text)


def parse_with_grammar(kind: str, text: str) -> dict[str, Any]:
    """The pyparsing path: Rust debug dumps, enum reprs, bare words, truncated lines.
    `text` comes stripped (parse_repr)."""
    import pyparsing as pp

    g = _grammar()
    try:
        if kind == "python_kwargs":
            # the text runs to the end of the line; take as many k=v pairs as parse
            res = g["kwargs"].parse_string(text, parse_all=False)
            return {str(k): _unwrap(v) for k, v in res}
        if kind == "command_line":
            return _parse_command_line(text)
        res = g["value"].parse_string(text, parse_all=False)
    except pp.ParseBaseException:
        return {}
    v = res[0] if res else None
    if isinstance(v, dict):
        return {str(k): _unwrap(x) for k, x in v.items() if k != "_"}
    return {}


def _parse_command_line(text: str) -> dict[str, Any]:
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("--"):
            key = w[2:]
            if "=" in key:
                key, val = key.split("=", 1)
                out[key.replace("-", "_")] = _scalar(val)
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                out[key.replace("-", "_")] = _scalar(words[i + 1])
                i += 1
            else:
                out[key.replace("-", "_")] = True
        elif i > 0 and words[i - 1] == "serve" and "model" not in out:
            out["model"] = w
        i += 1
    return out


def _scalar(s: str) -> Any:
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return s


def canonical_launch(raw: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """Keep the parameters the advice and report use, under their canonical names."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        key = names.get(k, k)
        if key not in CANONICAL and key not in names.values():
            continue
        if v is None:
            continue
        if isinstance(v, (dict, list, tuple)) and key not in ("limit_mm_per_prompt", "served_model_name"):
            continue
        if isinstance(v, tuple):
            v = list(v)
        out[key] = v
    return out
