"""Memory arithmetic against published parameter counts and what engines measured in real logs."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from diagnose.budget.architecture import shape_from_config
from diagnose.budget.config import ConfigError, load_config, parse_gpus_spec
from diagnose.budget.kv import kv_bytes_per_token
from diagnose.budget.search import plan
from diagnose.budget.units import GIB
from diagnose.budget.weights import weight_bytes
from diagnose.plan.check import parse_launch

from .conftest import FIXTURES, REAL_LOGS, REFERENCE, run

CONFIGS = FIXTURES / "configs"
PUBLISHED = yaml.safe_load((CONFIGS / "published.yaml").read_text())
# the whole reference set, when ../shared is here (rounded "1 T" and a file without the vision tower)
REFERENCE_PUBLISHED = {
    "meta-llama-Meta-Llama-3.1-405B": (405, 0.01),
    "mistralai-Mixtral-8x22B-v0.1": (141, 0.01),
    "Qwen-Qwen2.5-14B": (14.7, 0.01),
    "Qwen-Qwen2.5-32B": (32.5, 0.01),
    "Qwen-Qwen3-8B": (8.2, 0.01),
    "Qwen-Qwen3-14B": (14.8, 0.01),
    "Qwen-Qwen3-32B": (32.8, 0.01),
    "Qwen-Qwen3-235B-A22B-FP8": (235, 0.01),
    "deepseek-ai-DeepSeek-R1": (671, 0.01),
    "openai-gpt-oss-120b": (117, 0.01),
    "moonshotai-Kimi-K2-Instruct": (1000, 0.03),
    "meta-llama-Llama-4-Scout-17B-16E-Instruct": (109, 0.015),
    # vision towers: Qwen2-VL's ViT width is embed_dim (hidden_size is the merger's output),
    # Qwen2.5-VL's MLP is gated, both merge patches before the LLM
    "Qwen-Qwen2-VL-7B-Instruct": (8.29, 0.01),
    "Qwen-Qwen2.5-VL-7B-Instruct": (8.29, 0.01),
    # fields the config class fills in (Gemma 3's vocabulary, tied embeddings) and other
    # families' names for the usual ones (ChatGLM's num_layers, padded_vocab_size, …)
    "google-gemma-3-27b-it": (27.4, 0.01),
    "google-gemma-2-9b": (9.24, 0.01),
    "THUDM-chatglm3-6b": (6.24, 0.01),
    "THUDM-glm-4-9b": (9.4, 0.01),
}


def shape(name: str, **kw):
    return shape_from_config(load_config(str(CONFIGS / f"{name}.json")), **kw)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_the_model_card(name):
    want = PUBLISHED[name]
    got = shape(name).params_total / 1e9
    assert abs(got - want["params_b"]) / want["params_b"] <= want["tol"], got


@pytest.mark.skipif(not (REFERENCE / "configs").is_dir(), reason="../shared/reference not present")
@pytest.mark.parametrize("name", sorted(REFERENCE_PUBLISHED))
def test_reference_configs_parameter_counts(name):
    want, tol = REFERENCE_PUBLISHED[name]
    got = shape_from_config(load_config(str(REFERENCE / "configs" / f"{name}.json"))).params_total / 1e9
    assert abs(got - want) / want <= tol, got


def test_kv_bytes_per_token_standard_and_mla():
    assert kv_bytes_per_token(shape("meta-llama-Meta-Llama-3.1-8B")) == 131_072  # 2×32×8×128×2
    assert kv_bytes_per_token(shape("deepseek-ai-DeepSeek-V3")) == 70_272  # (512+64)×61×2, the worked example
    assert kv_bytes_per_token(shape("meta-llama-Meta-Llama-3.1-8B"), "fp8") == 65_536
    # KV heads split across TP, replicated when TP exceeds them; the MLA latent never splits
    assert kv_bytes_per_token(shape("meta-llama-Meta-Llama-3.1-8B"), tp=4) == 32_768
    assert kv_bytes_per_token(shape("meta-llama-Meta-Llama-3.1-8B"), tp=16) == 16_384
    assert kv_bytes_per_token(shape("deepseek-ai-DeepSeek-V3"), tp=8) == 70_272
    gpt = shape("openai-gpt-oss-20b")
    assert (gpt.attn_layers, gpt.window_layers, gpt.window) == (24, 12, 128)
    nem = shape("nvidia-Nemotron-H-56B-Base-8K")
    assert nem.attn_layers == 10  # only the attention blocks of the hybrid keep a KV cache


def test_weights_follow_the_quantization():
    dense = weight_bytes(shape("meta-llama-Meta-Llama-3.1-8B")) / GIB
    fp8 = weight_bytes(shape("meta-llama-Meta-Llama-3.1-8B", quantization="fp8")) / GIB
    int4 = weight_bytes(shape("meta-llama-Meta-Llama-3.1-8B", quantization="awq")) / GIB
    # embeddings and lm_head stay in bf16 (1.96 GiB for Llama 3.1 8B)
    assert 14.9 < dense < 15.0 and 8.2 < fp8 < 8.6 and 5.0 < int4 < 5.6
    assert shape("Qwen-Qwen3-30B-A3B-FP8").quant == "fp8"  # quantization_config in the checkpoint
    assert 11 < weight_bytes(shape("openai-gpt-oss-20b")) / GIB < 14  # MXFP4 experts


@pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="../shared/real-logs not present")
def test_against_what_vllm_and_sglang_measured():
    """vllm-103 (Llama 3.1 8B on an L4) and sglang-105 (Llama 3.2 3B): weights and KV tokens."""
    vlog = next(REAL_LOGS.glob("vllm-103-*")) / "log.txt"
    text = vlog.read_text()
    loaded = float(re.search(r"Model loading took ([\d.]+) GiB", text).group(1))
    kv_gib = float(re.search(r"Available KV cache memory: ([\d.]+) GiB", text).group(1))
    kv_tokens = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", text).group(1).replace(",", ""))
    s8 = shape("meta-llama-Meta-Llama-3.1-8B")
    assert abs(weight_bytes(s8) / GIB - loaded) / loaded < 0.03
    assert abs(kv_gib * GIB / kv_bytes_per_token(s8) - kv_tokens) / kv_tokens < 0.10
    p = plan(s8, gpus=1, gpu_total_gib=23034 / 1024, util=0.92, max_model_len=32000, max_num_seqs=128)
    assert abs(p.kv_tokens - kv_tokens) / kv_tokens < 0.10 and p.fits
    slog = (next(REAL_LOGS.glob("sglang-105-*")) / "log.txt").read_text()
    used = float(re.search(r"Load weight end\..*?mem usage=([\d.]+) GB", slog).group(1))
    m = re.search(r"#tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB", slog)
    s3 = shape("meta-llama-Llama-3.2-3B")
    assert abs(weight_bytes(s3) / GIB - used) / used < 0.03
    tokens = (float(m.group(2)) + float(m.group(3))) * GIB / kv_bytes_per_token(s3)
    assert abs(tokens - int(m.group(1))) / int(m.group(1)) < 0.10


def test_plan_picks_the_smallest_valid_tp_and_says_what_would_fit():
    s70 = shape("meta-llama-Meta-Llama-3.1-70B")
    p = plan(s70, gpus=4, gpu_total_gib=80, max_model_len=8192)
    assert p.fits and p.tp == 2 and s70.heads % p.tp == 0
    tight = plan(s70, gpus=2, gpu_total_gib=80, max_model_len=32768)
    assert not tight.fits and any("shorter context" in w for w in tight.what_would)
    assert any("fp8 weights" in w for w in tight.what_would)
    none = plan(s70, gpus=1, gpu_total_gib=24, max_model_len=8192)
    assert not none.fits and none.reasons


def test_bad_configs_are_clean_errors(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        load_config(str(tmp_path))
    bad.write_text(json.dumps({"model_type": "mystery", "hidden_size": 1024}))
    with pytest.raises(ConfigError, match="field 'num_hidden_layers' missing"):
        shape_from_config(load_config(str(bad)))
    bad.write_text(
        json.dumps(
            {
                "model_type": "mystery",
                "hidden_size": 1024,
                "num_hidden_layers": 4,
                "num_attention_heads": 8,
                "vocab_size": 1000,
                "quantization_config": {"quant_method": "zeta"},
            }
        )
    )
    s = shape_from_config(load_config(str(bad)))
    assert s.params_total > 0 and any("zeta" in x for x in s.partial)
    huge = {"hidden_size": 4096, "num_hidden_layers": 10**12, "num_attention_heads": 32, "vocab_size": 32000}
    bad.write_text(json.dumps(huge))
    with pytest.raises(ConfigError, match="no model has that many"):  # not a loop that never ends
        shape_from_config(load_config(str(bad)))


def test_parse_gpus_spec_and_launch():
    assert parse_gpus_spec("2x80") == (2, 80.0) and parse_gpus_spec("8×141GiB") == (8, 141.0)
    assert parse_gpus_spec("two") is None
    eng, launch = parse_launch(["vllm", "serve", "m", "-tp", "8", "--max-model-len=4096", "--enforce-eager"])
    assert eng == "vllm" and launch == {
        "model": "m",
        "tensor_parallel_size": 8,
        "max_model_len": 4096,
        "enforce_eager": True,
    }
    eng, launch = parse_launch(
        [
            "python",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "m",
            "--tp-size",
            "2",
            "--mem-fraction-static",
            "0.8",
        ]
    )
    assert eng == "sglang" and launch["tensor_parallel_size"] == 2 and launch["gpu_memory_utilization"] == 0.8


def run_cli(cli, *args):
    return run([*cli, *args])


def test_plan_cli_json(cli):
    p = run_cli(
        cli,
        "plan",
        "--config",
        str(CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json"),
        "--gpus",
        "1x80",
        "--json",
    )
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["fits"] is True
    assert {
        "params_total",
        "weights_gib_per_gpu",
        "kv_bytes_per_token",
        "kv_tokens",
        "max_concurrency",
        "tensor_parallel_size",
        "fits",
        "assumptions",
        "launch",
    } <= set(doc)
    assert doc["kv_bytes_per_token"] == 131072 and doc["launch"].startswith("vllm serve")
    p = run_cli(
        cli,
        "plan",
        "--config",
        str(CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json"),
        "--gpus",
        "1x80",
        "--engine",
        "generic",
    )
    assert p.returncode == 0 and "tensor_parallel_size: 1" in p.stdout.decode()
    p = run_cli(
        cli,
        "plan",
        "--config",
        str(CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json"),
        "--gpus",
        str(FIXTURES / "nvidia-smi" / "table-2x-a100-550-busy.txt"),
        "--engine",
        "sglang",
    )
    assert p.returncode == 0 and "sglang.launch_server" in p.stdout.decode()


def test_check_cli(cli, tmp_path):
    model = tmp_path / "llama8b"
    model.mkdir()
    (model / "config.json").write_text((CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json").read_text())
    p = run_cli(
        cli,
        "check",
        "--gpus",
        "2x24",
        "--json",
        "--",
        "vllm",
        "serve",
        str(model),
        "--tensor-parallel-size",
        "3",
        "--max-model-len",
        "200000",
    )
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["ok"] is False
    params = [pr["param"] for pr in doc["problems"]]
    assert params.count("tensor_parallel_size") >= 1 and "max_model_len" in params
    first = doc["problems"][0]["change"]
    assert first["flag"] == "--tensor-parallel-size" and first["to"] == "2"
    p = run_cli(cli, "check", "--gpus", "1x80", "--", "vllm", "serve", str(model), "--max-model-len", "8192")
    assert p.returncode == 0 and "can work" in p.stdout.decode()
    cfg = tmp_path / "deepinfer.yaml"
    cfg.write_text("tensor_parallel_size: 4\ngpu_memory_utilization: 0.9\nmax_concurrent_requests: 32\n")
    p = run_cli(cli, "check", "--gpus", "2x24", "--json", "--", str(cfg))
    doc = json.loads(p.stdout)
    assert doc["engine"] == "generic" and doc["problems"][0]["change"]["flag"] == "tensor_parallel_size"


def test_scan_with_config_joins_the_budget(cli):
    p = run_cli(
        cli,
        "scan",
        "--json",
        str(FIXTURES / "logs" / "generic" / "oom-load.log"),
        "--config",
        str(CONFIGS / "meta-llama-Meta-Llama-3.1-70B.json"),
    )
    doc = json.loads(p.stdout)
    facts = doc["primary"]["facts"]
    assert facts["plan_weights_gib_per_gpu"] > 60 and "weights need" in doc["primary"]["note"]


@pytest.mark.skipif(not (REFERENCE / "configs").is_dir(), reason="../shared/reference not present")
def test_gemma_interleaves_sliding_window_layers():  # type: ignore[no-untyped-def]
    """Gemma 2 alternates windowed and global layers; Gemma 3 attends globally every sixth
    (sliding_window_pattern, filled from the config class when config.json omits it)."""
    g2 = shape_from_config(load_config(str(REFERENCE / "configs" / "google-gemma-2-9b.json")))
    g3 = shape_from_config(load_config(str(REFERENCE / "configs" / "google-gemma-3-27b-it.json")))
    assert (g2.window, g2.window_layers, g2.attn_layers) == (4096, 21, 42)
    assert (g3.window, g3.window_layers, g3.attn_layers) == (1024, 52, 62)
    assert g3.tied and g3.vocab == 262208
    assert g3.max_position == 131072  # its linear rope factor does not extend the limit


def test_a_config_no_model_could_have_is_named(cli, tmp_path):
    """A zero KV-head count, a device instead of a file, a file nested past any model's: one
    line naming the file (and the field), exit 2 (#26)."""
    good = json.loads((CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json").read_text())
    zero = tmp_path / "kv0.json"
    zero.write_text(json.dumps({**good, "num_key_value_heads": 0}))
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' * 50000 + "1" + "}" * 50000)
    four = tmp_path / "bits.json"
    four.write_text(json.dumps({**good, "quantization_config": {"quant_method": "gptq", "bits": "four"}}))
    for cfg, said in (
        (zero, "field 'num_key_value_heads'"),
        (four, "field 'quantization_config.bits'"),
        ("/dev/zero", "not a regular file"),
        (deep, "nested"),
    ):
        p = run_cli(cli, "plan", "--config", str(cfg), "--gpus", "1x80")
        err = p.stderr.decode()
        assert p.returncode == 2 and said in err and len(err.strip().splitlines()) == 1, err


def test_check_with_nothing_to_hold_the_model_against_says_so_without_a_tick(cli):
    """No config.json and no GPUs: nothing said the launch cannot work, but the memory was not
    checked; the answer is neutral (no tick), exit 0, and JSON says memory_checked false."""
    p = run_cli(cli, "check", "--", "vllm", "serve", "M")
    out = p.stdout.decode()
    assert p.returncode == 0 and "memory not checked" in out and "✓" not in out and "can work" not in out
    doc = json.loads(run_cli(cli, "check", "--json", "--", "vllm", "serve", "M").stdout)
    assert doc["ok"] is True and doc["memory_checked"] is False


def test_plan_answers_at_what_context_it_fits_when_none_was_asked(cli):
    """The commonest question (an 8B model on a 24 GiB card, no context asked): the longest that
    fits, as `--max-model-len auto` picks it, with the launch to copy; asked for the model's own
    131,072, it does not fit."""
    cfg = str(CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json")
    p = run_cli(cli, "plan", "--config", cfg, "--gpus", "1x24")
    out = p.stdout.decode()
    assert p.returncode == 0 and out.startswith("✓ fits with --max-model-len ")
    auto = int(out.split("--max-model-len ", 1)[1].split(":", 1)[0])
    assert 32768 <= auto < 131072 and f"--max-model-len {auto} " in out
    doc = json.loads(run_cli(cli, "plan", "--config", cfg, "--gpus", "1x24", "--json").stdout)
    assert doc["fits"] and doc["max_model_len_auto"] and doc["max_model_len"] == auto
    p = run_cli(cli, "plan", "--config", cfg, "--gpus", "1x24", "--max-model-len", "131072")
    assert p.returncode == 1 and p.stdout.decode().startswith("✗ does not fit")
