"""plan and check never print a launch or a change that their own budget rejects (issue 18)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from diagnose.budget.alternatives import fp8_supported
from diagnose.budget.units import GIB as GIB_

from .conftest import REFERENCE, run

CONFIGS = REFERENCE / "configs"
SMI = REFERENCE / "nvidia-smi"
DIAGNOSE = [sys.executable, "-m", "diagnose"]

pytestmark = pytest.mark.skipif(not CONFIGS.is_dir(), reason="../shared/reference is not here")


def _json(args: list[str]) -> dict:  # type: ignore[type-arg]
    r = run([*DIAGNOSE, args[0], "--json", *args[1:]])
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_a_plan_that_does_not_fit_prints_no_launch():  # type: ignore[no-untyped-def]
    doc = _json(["plan", "--config", str(CONFIGS / "deepseek-ai-DeepSeek-R1.json"), "--gpus", "8x80"])
    assert doc["fits"] is False and doc["launch"] is None
    assert any("more GPUs" in w for w in doc["what_would_fit"])
    text = run(
        [*DIAGNOSE, "plan", "--config", str(CONFIGS / "deepseek-ai-DeepSeek-R1.json"), "--gpus", "8x80"]
    )
    assert b"vllm serve" not in text.stdout


def test_a_shorter_context_is_never_above_the_models_limit():  # type: ignore[no-untyped-def]
    cfg = str(CONFIGS / "meta-llama-Meta-Llama-3-70B.json")  # max_position_embeddings 8192
    doc = _json(["plan", "--config", cfg, "--gpus", "8x80", "--max-model-len", "32768"])
    assert doc["fits"] is False and doc["launch"] is None
    assert "a shorter context: --max-model-len 8192 at tp=8" in doc["what_would_fit"]
    fitting = _json(["plan", "--config", cfg, "--gpus", "8x80"])
    assert fitting["fits"] and "--max-model-len 8192" in fitting["launch"]


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("Quadro RTX 4000", False),
        ("Tesla T4", False),
        ("Tesla V100-SXM2-32GB", False),
        ("NVIDIA GeForce RTX 2080 Ti", False),
        ("NVIDIA RTX A6000", True),  # Ampere: FP8 weight-only (Marlin)
        ("NVIDIA H200", True),
        ("NVIDIA L4", True),
        ("NVIDIA RTX 6000 Ada Generation", True),
        (None, None),
    ],
)
def test_fp8_support_by_gpu_name(name, ok):  # type: ignore[no-untyped-def]
    assert fp8_supported(name) is ok


def test_check_never_proposes_fp8_on_turing_nor_a_change_that_does_not_fit():  # type: ignore[no-untyped-def]
    doc = _json(
        [
            "check",
            "--gpus",
            str(SMI / "05-quadro-rtx4000-csv-busy.txt"),
            "--config",
            str(CONFIGS / "Qwen-Qwen2.5-14B.json"),
            "--",
            "vllm",
            "serve",
            "Qwen/Qwen2.5-14B",
            "--port",
            "0",
        ]
    )
    quant = [p for p in doc["problems"] if p["param"] == "quantization"]
    assert quant and quant[0]["change"] is None  # 27.5 GiB on an 8 GiB Turing card: nothing it runs fits
    assert "no quantisation these GPUs run" in quant[0]["text"]


def test_check_does_not_propose_a_parallel_size_whose_weights_do_not_fit():  # type: ignore[no-untyped-def]
    doc = _json(
        [
            "check",
            "--gpus",
            "2x24",
            "--config",
            str(CONFIGS / "Qwen-Qwen2.5-72B.json"),
            "--",
            "vllm",
            "serve",
            "Qwen/Qwen2.5-72B",
            "--tensor-parallel-size",
            "4",
            "--port",
            "0",
        ]
    )
    tps = [p for p in doc["problems"] if p["param"] == "tensor_parallel_size"]
    assert tps and all(p["change"] is None for p in tps)
    assert "the weights do not fit either" in tps[0]["text"]


def test_check_notices_a_port_already_taken():  # type: ignore[no-untyped-def]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        doc = _json(["check", "--", "vllm", "serve", "Qwen/Qwen2.5-7B", "--port", str(port)])
    (p,) = [p for p in doc["problems"] if p["param"] == "port"]
    assert f"port {port} is already taken" in p["text"]
    assert p["change"]["flag"] == "--port" and int(p["change"]["to"]) != port


def test_pipeline_stages_split_like_vllm_and_the_heaviest_must_fit():  # type: ignore[no-untyped-def]
    from diagnose.budget.architecture import shape_from_config
    from diagnose.budget.config import load_config
    from diagnose.budget.search import plan
    from diagnose.budget.units import GIB
    from diagnose.budget.weights import stage_layers, stage_weight_bytes, weight_bytes

    assert stage_layers(61, 4) == [15, 15, 16, 15]  # vLLM get_pp_indices: the remainder before the last
    assert stage_layers(32, 3) == [11, 11, 10]
    s = shape_from_config(load_config(str(CONFIGS / "deepseek-ai-DeepSeek-R1.json")))
    stages = stage_weight_bytes(s, 4)
    assert sum(stages) == pytest.approx(weight_bytes(s))  # untied: embeddings first, lm_head last
    assert max(stages) > weight_bytes(s) / 4 * 1.03  # the 16-layer stage, not the average
    p = plan(s, 32, 80.0, tp=8, pp=4)
    assert p.weights_gib_per_gpu == pytest.approx(max(stages) / 8 / GIB)
    too_many = plan(s, 128, 80.0, tp=1, pp=64)
    assert any("a stage would hold none" in r for r in too_many.reasons)


# --- the checkpoint's own size -----------------------------------------------------------------


def _model_dir(tmp_path, config: str, total_size: int | None = None):  # type: ignore[no-untyped-def]
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text((CONFIGS / config).read_text())
    if total_size is not None:  # the index the Hub publishes, its weight_map cut short
        index = {
            "metadata": {"total_size": total_size},
            "weight_map": {"lm_head.weight": "model-00004-of-00004.safetensors"},
        }
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d


def test_weights_come_from_the_index_when_beside_the_config(tmp_path):  # type: ignore[no-untyped-def]
    # Qwen2.5-7B's published index: metadata.total_size 15231233024 (bf16, 7.62 B parameters)
    d = _model_dir(tmp_path, "Qwen-Qwen2.5-7B.json", 15231233024)
    doc = _json(["plan", "--config", str(d / "config.json"), "--gpus", "1x24"])
    assert doc["weights_from"] == "model.safetensors.index.json (metadata.total_size)"
    assert doc["weights_gib_per_gpu"] == pytest.approx(15231233024 / 2**30, abs=0.01)
    arithmetic = _json(["plan", "--config", str(CONFIGS / "Qwen-Qwen2.5-7B.json"), "--gpus", "1x24"])
    assert arithmetic["weights_from"] == "config arithmetic"
    assert abs(arithmetic["weights_gib_per_gpu"] / doc["weights_gib_per_gpu"] - 1) < 0.03


def test_weights_from_safetensors_headers_without_an_index(tmp_path):  # type: ignore[no-untyped-def]
    import struct

    d = _model_dir(tmp_path, "Qwen-Qwen3-0.6B.json")
    header = {
        "__metadata__": {"format": "pt"},
        "model.embed_tokens.weight": {
            "dtype": "BF16",
            "shape": [151936, 1024],
            "data_offsets": [0, 311164928],
        },
        "model.norm.weight": {"dtype": "BF16", "shape": [1024], "data_offsets": [311164928, 311166976]},
    }
    raw = json.dumps(header).encode()
    with open(d / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)  # the header only: tensors are never read
    doc = _json(["plan", "--config", str(d), "--weights", str(d), "--gpus", "1x24"])
    assert doc["weights_from"] == "the headers of 1 safetensors file(s)"
    assert doc["weights_gib_per_gpu"] == pytest.approx(311166976 / 2**30, abs=0.01)


def test_a_broken_index_or_an_empty_weights_dir_is_one_line(tmp_path):  # type: ignore[no-untyped-def]
    d = _model_dir(tmp_path, "Qwen-Qwen2.5-7B.json")
    (d / "model.safetensors.index.json").write_text('{"metadata": {}}')
    r = run([*DIAGNOSE, "plan", "--config", str(d), "--gpus", "1x24"])
    assert r.returncode == 2 and b"metadata.total_size" in r.stderr and b"Traceback" not in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run([*DIAGNOSE, "plan", "--config", str(CONFIGS / "Qwen-Qwen2.5-7B.json"), "--weights", str(empty)])
    assert r.returncode == 2 and b"no model.safetensors.index.json" in r.stderr


def test_a_runtime_quantisation_keeps_the_arithmetic(tmp_path):  # type: ignore[no-untyped-def]
    d = _model_dir(tmp_path, "Qwen-Qwen2.5-7B.json", 15231233024)
    doc = _json(["plan", "--config", str(d), "--gpus", "1x24", "--quantization", "fp8"])
    assert doc["weights_from"] == "config arithmetic"
    assert doc["weights_gib_per_gpu"] < 9


# --- modules a quantised checkpoint keeps at the model dtype -------------------------------------


def test_fbgemm_fp8_keeps_attention_in_bf16():  # type: ignore[no-untyped-def]
    from diagnose.budget.architecture import shape_from_config
    from diagnose.budget.config import load_config
    from diagnose.budget.weights import weight_bytes

    fp8 = shape_from_config(load_config(str(CONFIGS / "meta-llama-Meta-Llama-3.1-405B-Instruct-FP8.json")))
    all_fp8 = shape_from_config(load_config(str(CONFIGS / "meta-llama-Meta-Llama-3.1-405B.json")), "fp8")
    ratio = weight_bytes(fp8) / weight_bytes(all_fp8)
    assert 1.15 < ratio < 1.21  # attention (and the first and last MLPs it lists) stay bf16
    assert any("attention (FFN-only FP8)" in p for p in fp8.partial)


def test_modules_to_not_convert_and_ignore_patterns_are_counted(tmp_path):  # type: ignore[no-untyped-def]
    from diagnose.budget.architecture import shape_from_config
    from diagnose.budget.config import load_config
    from diagnose.budget.weights import weight_bytes

    cfg = json.loads((CONFIGS / "Qwen-Qwen3-32B-FP8.json").read_text())
    base = weight_bytes(shape_from_config({**cfg, "__path__": "config.json"}))
    h, H, K, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q_proj = h * H * d
    cfg["quantization_config"]["modules_to_not_convert"] = ["lm_head", "model.layers.0.self_attn.q_proj"]
    one = weight_bytes(shape_from_config({**cfg, "__path__": "config.json"}))
    assert one - base == pytest.approx(q_proj * (2 - 1))  # bf16 instead of fp8
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}},
        "ignore": ["lm_head", "re:.*self_attn\\.(k|v)_proj"],
    }
    kv_kept = weight_bytes(shape_from_config({**cfg, "__path__": "config.json"}))
    assert kv_kept - base == pytest.approx(cfg["num_hidden_layers"] * 2 * h * K * d)
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(cfg))
    assert load_config(str(cfg_path))  # the file form reads the same


def test_exclusions_match_as_the_engines_match_them():  # type: ignore[no-untyped-def]
    """A module above the layer (`model.layers.3.self_attn`), a glob (`model.layers.*.self_attn`,
    ModelOpt's `self_attn*`), a bare component (`gate` is the router, never `gate_proj`) and `re:`
    patterns over shared experts (Kimi K2.5 keeps attention, shared experts and dense MLPs in
    bf16)."""
    from diagnose.budget.architecture import shape_from_config
    from diagnose.budget.config import load_config
    from diagnose.budget.weights import weight_bytes

    cfg = json.loads((CONFIGS / "Qwen-Qwen3-32B-FP8.json").read_text())
    base = weight_bytes(shape_from_config({**cfg, "__path__": "config.json"}))
    h, H, K, d, L = (
        cfg[k]
        for k in (
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "num_hidden_layers",
        )
    )
    attn = 2 * h * H * d + 2 * h * K * d
    for listed, grown in (
        (["model.layers.3.self_attn"], attn),
        (["model.layers.*.self_attn"], L * attn),
        (["model.layers.0.self_attn*"], attn),
        (["gate", "lm_head"], 0),
    ):
        cfg["quantization_config"]["ignored_layers"] = listed
        got = weight_bytes(shape_from_config({**cfg, "__path__": "config.json"})) - base
        assert got == pytest.approx(grown), listed
    kimi = shape_from_config(load_config(str(CONFIGS / "moonshotai-Kimi-K2.5.json")))
    note = next(p for p in kimi.partial if "kept at the model dtype" in p)
    assert "attention" in note and "shared" in note and "mlp" in note
    # 9.2 B parameters kept in bf16, the experts int4 with one bf16 scale per 32 weights and no
    # zeros (symmetric): 594 GB, the published checkpoint's size
    assert kimi.int4_layout == (32, False)
    assert weight_bytes(kimi) / 1e9 == pytest.approx(594, rel=0.01)


def test_modelopt_nvfp4_from_config_or_hf_quant_config(tmp_path):  # type: ignore[no-untyped-def]
    """ModelOpt names its algorithm in quant_algo (NVFP4 is 4.5 bits, not FP8), in config.json
    or in hf_quant_config.json beside it; attention it excludes by glob stays bf16."""
    from diagnose.budget.architecture import shape_from_config
    from diagnose.budget.config import load_config
    from diagnose.budget.weights import weight_bytes

    mm = shape_from_config(load_config(str(CONFIGS / "nvidia-MiniMax-M2.5-NVFP4.json")))
    assert mm.quant == "nvfp4" and any("(attention)" in p for p in mm.partial)
    fp8 = shape_from_config(load_config(str(CONFIGS / "MiniMaxAI-MiniMax-M2.5.json")))
    assert 0.55 < weight_bytes(mm) / weight_bytes(fp8) < 0.62
    (tmp_path / "config.json").write_text((CONFIGS / "nvidia-Qwen3-235B-A22B-NVFP4.json").read_text())
    (tmp_path / "hf_quant_config.json").write_text(
        (CONFIGS / "nvidia-Qwen3-235B-A22B-NVFP4_hf_quant.json").read_text()
    )
    q = shape_from_config(load_config(str(tmp_path)))
    assert q.quant == "nvfp4"
    assert weight_bytes(q) / GIB_ == pytest.approx(q.params_total * 0.5625 / GIB_, rel=0.03)
    (tmp_path / "hf_quant_config.json").write_text("{}")
    with pytest.raises(Exception, match=r"hf_quant_config\.json: field 'quantization' missing"):
        load_config(str(tmp_path))


def test_mxfp4_experts_are_padded_as_the_kernels_pad_them():  # type: ignore[no-untyped-def]
    """gpt-oss: hidden 2880 → 3072, intermediate per rank to a multiple of 64; vLLM measured 13.72
    GiB (20b) and 32.98 GiB per GPU at TP 2 (120b) for 12.8 / 60.8 GiB checkpoints."""
    from diagnose.budget.architecture import shape_from_config
    from diagnose.budget.config import load_config
    from diagnose.budget.search import plan
    from diagnose.budget.weights import expert_padding_bytes

    s20 = shape_from_config(load_config(str(CONFIGS / "openai-gpt-oss-20b.json")))
    s120 = shape_from_config(load_config(str(CONFIGS / "openai-gpt-oss-120b.json")))
    assert plan(s20, 1, 80, tp=1).weights_gib_per_gpu == pytest.approx(13.72, rel=0.03)
    assert plan(s120, 2, 80, tp=2).weights_gib_per_gpu == pytest.approx(32.98, rel=0.03)
    assert expert_padding_bytes(s120, 2) > expert_padding_bytes(s120, 1) > 0
    dense = shape_from_config(load_config(str(CONFIGS / "Qwen-Qwen3-8B.json")))
    assert expert_padding_bytes(dense, 1) == 0


def test_rope_scaling_extends_the_context_limit():  # type: ignore[no-untyped-def]
    from diagnose.budget.shape import context_limit

    cfg = json.loads((CONFIGS / "Qwen-Qwen2.5-7B.json").read_text())
    assert context_limit(cfg) == cfg["max_position_embeddings"]
    # the YaRN block Qwen's model card tells users to add for 128K
    yarn = {**cfg, "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}
    assert context_limit(yarn) == 131072
    llama = json.loads((CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json").read_text())
    assert llama["rope_scaling"]["rope_type"] == "llama3"
    assert context_limit(llama) == llama["max_position_embeddings"]  # already the extended length


def test_a_privileged_port_or_a_foreign_address_is_not_a_taken_port():  # type: ignore[no-untyped-def]
    from diagnose.host.ports import port_taken

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        assert port_taken(s.getsockname()[1])
    assert not port_taken(8000, "192.0.2.1")  # TEST-NET-1: not an address of this host


def test_sliding_window_layers_need_only_their_window():  # type: ignore[no-untyped-def]
    """Gemma 3 keeps the whole context in 10 of 62 layers and 1,024 tokens in the others: one
    131,072-token request costs far fewer cached tokens than 131,072 × every layer, so the plan
    fits although the all-layer token count is below the context (vLLM's hybrid KV cache)."""
    from diagnose.budget.architecture import shape_from_config
    from diagnose.budget.config import load_config
    from diagnose.budget.search import plan

    s = shape_from_config(load_config(str(CONFIGS / "google-gemma-3-27b-it.json")))
    p = plan(s, 2, 47.5, tp=2, max_model_len=131072)
    assert p.kv_tokens < 131072 and p.max_concurrency >= 1 and p.fits
    assert "--max-model-len 131072" in p.to_json()["launch"]
    dense = shape_from_config(load_config(str(CONFIGS / "Qwen-Qwen3-32B.json")))
    q = plan(dense, 2, 47.5, tp=2, max_model_len=131072)
    assert q.max_concurrency < 1 and not q.fits  # no window: the whole context in every layer


@pytest.mark.parametrize("gpus", ["1x24", "2x24", "4x80", "8x80", "4x48"])
@pytest.mark.parametrize("tp", [3, 5, 6, 7, 16])
def test_a_parallel_size_check_proposes_passes_its_own_check(gpus, tp):
    """Every tensor_parallel_size `check` proposes, over the real configs and GPU shapes, is one
    the same check then accepts (bar the launch's other problems): the proposal and the verdict
    come from one budget."""
    from diagnose.host.gpu_pool import uniform_pool
    from diagnose.knowledge.engine_profiles import load_profiles
    from diagnose.plan.check import preflight

    profiles = load_profiles()
    count, size = (int(x) for x in gpus.split("x"))
    own = Path(__file__).resolve().parent.parent / "fixtures" / "configs"
    for cfg in sorted([*CONFIGS.glob("*.json"), *own.glob("*.json")]):
        launch = ["vllm", "serve", "M", "--tensor-parallel-size", str(tp), "--max-model-len", "8192"]
        res = preflight(launch, str(cfg), uniform_pool(count, float(size), ""), profiles)
        for pr in res["problems"]:
            if pr["param"] != "tensor_parallel_size" or pr["change"] is None:
                continue
            again = list(launch)
            again[again.index(str(tp))] = pr["change"]["to"]
            res2 = preflight(again, str(cfg), uniform_pool(count, float(size), ""), profiles)
            # nothing new: only the launch's other problems (a context above the model's) remain
            others = {p["param"] for p in res["problems"] if p["param"] != "tensor_parallel_size"}
            left = {p["param"] for p in res2["problems"]}
            assert left <= others, (cfg.name, gpus, tp, pr["change"]["to"], res2["problems"])
