"""The miner (tools/mine): templates from printing statements, frame phases from call trees.

The sources here are small modules written in the shapes the engines use (f-strings, %-args
to a logger, str.format, a message built in a variable, assert messages; LLAMA_LOG_ERROR
with __func__ and PRId64, Go's slog/fmt.Errorf, Rust's thiserror and tracing); each pattern
is checked against the line the engine really prints, taken from ../shared/reference.
"""

from __future__ import annotations

import json
import re

from tools.mine.callgraph import frame_key, phases
from tools.mine.native_source import mine_native
from tools.mine.pattern import build, template_id
from tools.mine.python_source import mine_module
from tools.mine.store import write_store

PY = """
import logging
logger = logging.getLogger(__name__)

class ModelConfig:
    def verify_with_parallel_config(self, parallel_config):
        total_num_attention_heads = self.hf_text_config.num_attention_heads
        tensor_parallel_size = parallel_config.tensor_parallel_size
        if total_num_attention_heads % tensor_parallel_size != 0:
            raise ValueError(
                f"Total number of attention heads ({total_num_attention_heads})"
                " must be divisible by tensor parallel size "
                f"({tensor_parallel_size}).")

    def check(self, max_model_len, derived):
        msg = (f"User-specified max_model_len ({max_model_len}) is greater "
               f"than the derived max_model_len ({derived}).")
        raise ValueError(msg)

def _check_enough_kv_cache_memory(available_memory, needed_memory, max_model_len):
    if available_memory <= 0:
        raise ValueError("No available memory for the cache blocks. "
                         "Try increasing `gpu_memory_utilization` when initializing the engine.")
    logger.warning("Model loading took %.4f GiB and %.6f seconds", available_memory, needed_memory)
    logger.error("Failed to load {} with dtype {}".format(max_model_len, needed_memory))
    assert needed_memory > 0, "num_gpu_blocks must be positive, got %d" % needed_memory
"""


def test_python_templates_from_every_printing_shape() -> None:
    templates, functions, classes = mine_module(PY, "vllm/config.py")
    texts = {t.text: t for t in templates}
    heads = texts[
        "Total number of attention heads ({total_num_attention_heads}) must be divisible by "
        "tensor parallel size ({tensor_parallel_size})."
    ]
    assert (heads.level, heads.exc, heads.function) == (
        "raise",
        "ValueError",
        "ModelConfig.verify_with_parallel_config",
    )
    assert (
        "User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len ({derived})."
        in texts
    )
    assert texts["Model loading took {available_memory} GiB and {needed_memory} seconds"].level == "warning"
    assert texts["Failed to load {max_model_len} with dtype {needed_memory}"].level == "error"
    assert texts["num_gpu_blocks must be positive, got {needed_memory}"].exc == "AssertionError"
    assert "ModelConfig" in classes
    assert {f.qualname for f in functions} >= {"ModelConfig.check", "_check_enough_kv_cache_memory"}


def test_pattern_finds_the_line_the_engine_prints_with_typed_captures() -> None:
    templates, _f, _c = mine_module(PY, "vllm/config.py")
    by_text = {t.text: t for t in templates}
    t = by_text[
        "Total number of attention heads ({total_num_attention_heads}) must be divisible by "
        "tensor parallel size ({tensor_parallel_size})."
    ]
    built = build(t.pieces)
    assert built is not None
    pattern, literal = built
    assert literal == ") must be divisible by tensor parallel size ("
    line = "ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3)."
    m = re.search(pattern, line)
    assert m is not None and m.group("tensor_parallel_size") == "3"
    took = build(by_text["Model loading took {available_memory} GiB and {needed_memory} seconds"].pieces)
    assert took is not None
    m = re.search(
        took[0], "INFO 06-05 06:17:02 model_runner.py:1072] Model loading took 14.9888 GiB and 5.191 seconds"
    )
    assert m is not None and m.group("available_memory") == "14.9888"


def test_a_template_too_vague_to_tell_apart_has_no_pattern() -> None:
    templates, _f, _c = mine_module('def f(x):\n    raise ValueError(f"bad {x}")\n', "m.py")
    assert build(templates[0].pieces) is None


def test_template_ids_are_stable_across_versions_and_modules() -> None:
    assert template_id("vllm", "raise|ValueError|x") == template_id("vllm", "raise|ValueError|x")
    assert template_id("vllm", "raise|ValueError|x") != template_id("sglang", "raise|ValueError|x")


C_SRC = r"""
static bool llama_kv_cache_init(struct llama_kv_cache & cache) {
    if (!buf) {
        LLAMA_LOG_ERROR("%s: failed to allocate buffer for kv cache\n", __func__);
        return false;
    }
    LLAMA_LOG_WARN("%s: n_ctx_per_seq (%" PRIu32 ") < n_ctx_train (%" PRIu32 ") -- the full capacity of the model will not be utilized\n", __func__, n_ctx_per_seq, n_ctx_train);
    throw std::runtime_error(format("invalid n_gpu_layers: %d", n));
}
"""
GO_SRC = """
func (s *Server) load() error {
    slog.Error("failed to load model", "error", err)
    return fmt.Errorf("model requires more system memory (%s) than is available (%s)", need, avail)
}
"""
RS_SRC = """
#[derive(Error, Debug)]
pub enum InferError {
    #[error("Request failed during generation: {0}")]
    GenerationError(String),
}
fn f() { tracing::error!("Model is overloaded"); }
"""


def test_native_templates_c_go_rust() -> None:
    c = {t.level: t for t in mine_native(C_SRC, "src/llama.cpp")}
    err = build(c["error"].pieces)
    assert err is not None
    assert re.search(err[0], "llama_kv_cache_init: failed to allocate buffer for kv cache")
    warn = build(c["warning"].pieces)
    assert warn is not None
    m = re.search(
        warn[0],
        "llama_init_from_model: n_ctx_per_seq (4096) < n_ctx_train (131072) -- the full capacity of the model will not be utilized",
    )
    assert m is not None
    assert c["raise"].exc == "std::runtime_error"
    go = mine_native(GO_SRC, "server/sched.go")
    assert {t.level for t in go} == {"error", "raise"}
    need = build(next(t for t in go if t.level == "raise").pieces)
    assert need is not None and re.search(
        need[0], "Error: model requires more system memory (21.4 GiB) than is available (15.2 GiB)"
    )
    rs = mine_native(RS_SRC, "router/src/infer/mod.rs")
    gen = build(next(t for t in rs if t.level == "raise").pieces)
    assert gen is not None
    assert re.search(
        gen[0],
        "ERROR generate{...}: text_generation_router::infer: router/src/infer/mod.rs:145: Request failed during generation: Server error: CUDA out of memory.",
    )


GRAPH = {
    "eng/loader.py": """
def get_model(cfg):
    return Llama(cfg)
""",
    "eng/models/llama.py": """
class Llama:
    def __init__(self, cfg):
        self.layers = [DecoderLayer(cfg)]
class DecoderLayer:
    def __init__(self, cfg):
        self.mlp = ColumnLinear(cfg)
""",
    "eng/layers/linear.py": """
class ColumnLinear:
    def __init__(self, cfg):
        self.create_weights(cfg)
    def create_weights(self, cfg):
        return make_param(cfg)
def make_param(cfg):
    return cfg
""",
    "eng/runner.py": """
class Runner:
    def __init__(self, cfg):
        self.model = get_model(cfg)
        self.profile_run()
    def profile_run(self):
        self._dummy_run()
    def _dummy_run(self):
        return shared_helper()
    def execute_model(self, batch):
        return shared_helper()
def shared_helper():
    return 1
""",
}
ROOTS = {"load": ["get_model"], "startup": ["profile_run"], "runtime": ["execute_model"]}


def _graph() -> dict[str, str]:
    fns, classes = [], {}
    for path, src in GRAPH.items():
        _t, f, c = mine_module(src, path)
        fns += f
        classes.update(c)
    got, roots = phases(fns, classes, ROOTS)
    assert roots["startup"] == {"runner:profile_run"}
    return got


def test_frame_phases_follow_constructors_and_stop_at_ambiguity() -> None:
    got = _graph()
    # building the model: every constructor down to the parameter is load
    assert got["llama:__init__"] == "load"
    assert got["linear:__init__"] == "load"
    assert got["linear:create_weights"] == "load"
    assert got["linear:make_param"] == "load"
    assert got["runner:_dummy_run"] == "startup"
    assert got["runner:execute_model"] == "runtime"
    # reached from profiling and from serving: no phase
    assert got["runner:shared_helper"] == ""
    # the engine's constructor runs every phase's roots but no root reaches it
    assert "runner:__init__" not in got
    assert frame_key("eng/models/llama.py", "Llama.__init__") == "llama:__init__"


def test_a_done_callback_has_the_phase_of_the_task_it_watches() -> None:
    """vLLM V0's AsyncLLMEngine and LMDeploy's engine loop: the background loop's task gets a
    done-callback that re-raises its exception; a traceback through it is the loop's phase."""
    src = """
import asyncio
from functools import partial

class AsyncEngine:
    def start_background_loop(self):
        self._task = asyncio.get_event_loop().create_task(self.run_engine_loop())
        self._task.add_done_callback(partial(_raise_exception_on_finish, tracker=self.tracker))
    async def run_engine_loop(self):
        await self.engine_step()
    async def engine_step(self):
        return 1

def _raise_exception_on_finish(task, tracker):
    task.result()
"""
    _t, fns, classes = mine_module(src, "eng/engine/async_llm_engine.py")
    got, _roots = phases(fns, classes, {"runtime": ["run_engine_loop"]})
    assert got["async_llm_engine:_raise_exception_on_finish"] == "runtime"


def test_store_is_one_record_a_line_with_version_ranges(tmp_path) -> None:
    data = {
        "engine": "vllm",
        "source": "vllm",
        "versions": ["0.5.5", "0.6.3", "0.6.6", "0.7.3"],
        "provenance": [{"version": "0.5.5", "file": "vllm-0.5.5.whl", "sha256": "ab"}],
        "templates": [
            {
                "id": "vllm.m.1",
                "text": "x",
                "pattern": "x",
                "literal": "x",
                "level": "raise",
                "exc": "E",
                "seen": [0, 1, 3],
            }
        ],
        "frames": {"llama:__init__": "load"},
    }
    out = tmp_path / "vllm.json"
    write_store(out, data, [])
    back = json.loads(out.read_text())
    assert back["templates"][0]["versions"] == "0.5.5–0.6.3, 0.7.3"
    assert back["frames"] == {"llama:__init__": "load"}
    assert sum(1 for line in out.read_text().splitlines() if '"id"' in line) == 1
