"""One search behind `plan` and `check`: every launch it proposes — the plan's own, each of its
alternatives, the launch `check` gives to copy — passes `check` on the same GPUs, over the real
configs of ../shared/reference/configs and the GPU shapes users ask about (one of them an
nvidia-smi snapshot with a busy GPU); a model that fits on the GPUs given is never sent to more.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from diagnose.budget.architecture import shape_from_config
from diagnose.budget.config import ConfigError, load_config
from diagnose.budget.plan import launch_text
from diagnose.budget.search import plan, with_auto_context
from diagnose.knowledge.engine_profiles import load_profiles
from diagnose.plan.check import preflight
from diagnose.plan.gpus_given import gpus_from
from diagnose.plan.launch_command import leading_env

from .conftest import REFERENCE

CONFIGS = REFERENCE / "configs"
OWN = Path(__file__).resolve().parent.parent / "fixtures"
BUSY = str(OWN / "nvidia-smi" / "csv-4x-h100-one-busy.csv")  # GPU 0 holds 69.6 GiB
SHAPES = ["1x24", "1x80", "2x80", "4x80", "8x80", BUSY]
PROFILES = load_profiles()

pytestmark = pytest.mark.skipif(not CONFIGS.is_dir(), reason="../shared/reference is not here")


@pytest.fixture(autouse=True)
def _no_visible_devices(monkeypatch):  # type: ignore[no-untyped-def]
    """This environment's CUDA_VISIBLE_DEVICES is not the test's."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _configs() -> list[Path]:
    out = []
    for cfg in sorted(CONFIGS.glob("*.json")):
        try:
            shape_from_config(load_config(str(cfg)))
        except ConfigError:
            continue  # a quant config beside its model's (…_hf_quant.json), not a model
        out.append(cfg)
    return out


CONFIG_FILES = _configs()


def _memory_problems(launch: str, cfg: Path, gpus: str) -> list[dict[str, Any]]:
    """`check` of a launch line on these GPUs, without the host's own port (not the budget's)."""
    words = shlex.split(launch.replace("MODEL", "M"))
    pool = gpus_from(gpus, visible=leading_env(words).get("CUDA_VISIBLE_DEVICES"))
    res = preflight(words, str(cfg), pool, PROFILES)
    return [p for p in res["problems"] if p["param"] != "port"]


def test_there_are_enough_real_configs():  # type: ignore[no-untyped-def]
    assert len(CONFIG_FILES) >= 40


@pytest.mark.parametrize("context", [None, 32768])
@pytest.mark.parametrize("gpus", SHAPES, ids=lambda g: Path(g).name)
def test_every_launch_plan_proposes_passes_check(gpus, context):  # type: ignore[no-untyped-def]
    failures = []
    for cfg in CONFIG_FILES:
        s = shape_from_config(load_config(str(cfg)))
        pool = gpus_from(gpus)
        asked = min(context, s.max_position or context) if context else None
        p = plan(s, pool.count, 0.0, pool=pool, max_model_len=asked)
        p, _ = with_auto_context(p, asked)
        launches = [launch_text(p)] if p.fits else []
        for pr in p.proposals:
            if pr.kind in ("more_gpus", "free_gpus"):
                continue  # not a launch on these GPUs as they are
            assert pr.plan.fits, (cfg.name, gpus, pr.text)
            launches.append(launch_text(pr.plan))
        for launch in launches:
            left = _memory_problems(launch, cfg, gpus)
            if left:
                failures.append((cfg.name, launch, [x["text"] for x in left]))
    assert not failures, failures[:5]


@pytest.mark.parametrize("gpus", SHAPES, ids=lambda g: Path(g).name)
def test_a_model_that_fits_on_the_gpus_given_is_never_sent_to_more(gpus):  # type: ignore[no-untyped-def]
    for cfg in CONFIG_FILES:
        s = shape_from_config(load_config(str(cfg)))
        pool = gpus_from(gpus)
        p = plan(s, pool.count, 0.0, pool=pool, max_model_len=min(8192, s.max_position or 8192))
        if p.fits:
            assert p.tp * p.pp <= len(pool.healthy)
            continue
        fits_here = [pr for pr in p.proposals if pr.kind not in ("more_gpus", "free_gpus")]
        keeps = [pr for pr in fits_here if "max_model_len" not in pr.changes]
        if keeps:
            assert not any(pr.kind == "more_gpus" for pr in p.proposals), (cfg.name, gpus)


@pytest.mark.parametrize("gpus", SHAPES, ids=lambda g: Path(g).name)
@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_the_launch_check_gives_to_copy_passes_check(gpus, tp):  # type: ignore[no-untyped-def]
    failures = []
    for cfg in CONFIG_FILES:
        launch = ["vllm", "serve", "M", "--tensor-parallel-size", str(tp), "--max-model-len", "8192"]
        pool = gpus_from(gpus)
        res = preflight(launch, str(cfg), pool, PROFILES)
        for pr in res["problems"]:
            to = pr["change"]["to"] if pr["change"] else None
            if pr["param"] == "tensor_parallel_size" and to is not None:
                assert int(to) <= pool.count, (cfg.name, gpus, tp, to)  # never more GPUs than given
        if res["fixed_launch"]:
            left = _memory_problems(res["fixed_launch"], cfg, gpus)
            if left:
                failures.append((cfg.name, res["fixed_launch"], [x["text"] for x in left]))
    assert not failures, failures[:5]


def test_the_70b_on_four_gpus_gets_tp_4():  # type: ignore[no-untyped-def]
    cfg = CONFIGS / "meta-llama-Meta-Llama-3.1-70B.json"
    s = shape_from_config(load_config(str(cfg)))
    pool = gpus_from("4x80")
    p = plan(s, 4, 0.0, pool=pool)
    assert p.fits and p.tp == 4  # the model's whole 131,072 context
    asked3 = plan(s, 4, 0.0, tp=3, pool=pool)
    assert asked3.proposals[0].kind == "parallel" and asked3.proposals[0].changes == {
        "tensor_parallel_size": 4
    }
    res = preflight(["vllm", "serve", "M", "--tensor-parallel-size", "3"], str(cfg), pool, PROFILES)
    first = res["problems"][0]
    assert first["change"]["to"] == "4" and "--tensor-parallel-size 4" in res["fixed_launch"]
    res2 = preflight(["vllm", "serve", "M", "--tensor-parallel-size", "2"], str(cfg), pool, PROFILES)
    assert res2["problems"][0]["change"]["to"] == "4"  # the smallest change: the GPUs already there
    assert any("--max-model-len 20480" in a for a in res2["problems"][0]["alternatives"])


def test_a_busy_gpu_is_left_out_and_named():  # type: ignore[no-untyped-def]
    cfg = CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json"
    s = shape_from_config(load_config(str(cfg)))
    pool = gpus_from(BUSY)
    assert [g.index for g in pool.busy] == [0] and "GPU 0 is busy (69.6 GiB in use" in pool.notes[0]
    p = plan(s, pool.count, 0.0, pool=pool, max_model_len=8192)
    assert p.fits and p.tp == 1 and p.devices == (1,)  # not "tp=32 on 32 GPUs"
    assert launch_text(p).startswith("CUDA_VISIBLE_DEVICES=1 vllm serve")
    res = preflight(["vllm", "serve", "M", "--max-model-len", "8192"], str(cfg), pool, PROFILES)
    assert [p["param"] for p in res["problems"] if p["param"] != "port"] == ["env:CUDA_VISIBLE_DEVICES"]
    assert res["fixed_launch"].startswith("CUDA_VISIBLE_DEVICES=1 vllm serve")
    # one output, one answer: no "→ tp 2" beside "no parallel size fits"
    texts = " ".join(p["text"] for p in res["problems"])
    assert "no parallel size" not in texts


def test_cuda_visible_devices_is_honoured():  # type: ignore[no-untyped-def]
    cfg = CONFIGS / "meta-llama-Meta-Llama-3.1-70B.json"
    s = shape_from_config(load_config(str(cfg)))
    pool = gpus_from(BUSY, visible="0,2,3")  # as the environment would set it
    assert [g.index for g in pool.gpus] == [0, 2, 3] and pool.visible == "0,2,3"
    p = plan(s, pool.count, 0.0, pool=pool, max_model_len=8192)
    assert p.fits and p.devices == (2, 3)  # tp 2 on the two free ones it may see
    assert launch_text(p).startswith("CUDA_VISIBLE_DEVICES=2,3 ")
    # the launch's own CUDA_VISIBLE_DEVICES narrows check's GPUs the same way
    launch = "CUDA_VISIBLE_DEVICES=2,3 vllm serve M --tensor-parallel-size 2 --max-model-len 8192"
    assert _memory_problems(launch, cfg, BUSY) == []
    assert _memory_problems(launch.replace("=2,3", "=0,2"), cfg, BUSY)  # GPU 0 is the busy one


def test_plan_answers_at_what_context_and_what_more_would_give():  # type: ignore[no-untyped-def]
    from diagnose.budget.search import beyond_auto

    s = shape_from_config(load_config(str(CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json")))
    pool = gpus_from("1x24")
    q, auto = with_auto_context(plan(s, 1, 0.0, pool=pool), None)
    assert q.fits and auto == 43008 and q.max_model_len == 43008
    more = beyond_auto(q, pool)
    assert more and more[0].changes["kv_cache_dtype"] == "fp8" and more[0].changes["max_model_len"] > auto
    two = gpus_from("2x24")
    q2, auto2 = with_auto_context(plan(s, 2, 0.0, pool=two), None)
    assert q2.fits and auto2 is None and q2.tp == 2  # the whole context on the two GPUs given


def test_the_launch_names_the_model(tmp_path):  # type: ignore[no-untyped-def]
    from diagnose.budget.config import model_id

    folder = tmp_path / "Llama-3.1-8B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text((CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json").read_text())
    (folder / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 16060522496}}')
    assert model_id(load_config(str(folder)), str(folder)) == str(folder)
    assert model_id(load_config(str(folder / "config.json")), str(folder / "config.json")) == str(folder)
    cache = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B" / "snapshots" / "0e9e39f"
    cache.mkdir(parents=True)
    (cache / "config.json").write_text((CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json").read_text())
    assert model_id(load_config(str(cache)), str(cache)) == "meta-llama/Llama-3.1-8B"
    glm = CONFIGS / "THUDM-glm-4-9b.json"  # a bare config that names its hub id
    assert model_id(load_config(str(glm)), str(glm)) == "THUDM/glm-4-9b"
    wizard = CONFIGS / "TheBloke-Wizard-Vicuna-30B-Uncensored-GPTQ.json"  # a converter's local path
    assert model_id(load_config(str(wizard)), str(wizard)) is None
    s = shape_from_config(load_config(str(CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json")))
    from diagnose.budget.units import engine_units

    llama = plan(s, 1, 24.0, max_model_len=8192, units=engine_units("llamacpp"))
    assert launch_text(llama).startswith("llama-server -m MODEL.gguf ")  # a GGUF file, not a checkpoint


def _readme_examples() -> list[tuple[str, list[str]]]:
    """The README's `plan` and `check` examples: (command, the lines it shows)."""
    import re

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    out = []
    for block in re.findall(r"```text\n(.*?)```", text, re.S):
        lines = block.rstrip("\n").split("\n")
        if lines[0].startswith("$ diagnose plan") or lines[0].startswith("$ diagnose check"):
            out.append((lines[0][2:], lines[1:]))
    return out


@pytest.mark.parametrize("example", _readme_examples(), ids=lambda e: e[0].split()[1])
def test_the_readme_shows_real_output(example, cli):  # type: ignore[no-untyped-def]
    """Each line the README shows (bar those it elides with …) is a line the command prints."""
    import os
    import subprocess

    command, shown = example
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    root = Path(__file__).resolve().parent.parent
    words = shlex.split(command)[1:]
    printed = subprocess.run([*cli, *words], cwd=root, env=env, capture_output=True, text=True).stdout
    norm = {" ".join(line.split()) for line in printed.splitlines()}
    for line in shown:
        if "…" in line:
            head = " ".join(line.split("…")[0].split())
            assert not head or any(p.startswith(head) for p in norm), (line, printed)
        else:
            assert " ".join(line.split()) in norm, (line, printed)


def test_mixed_gpus_are_named_in_nvidia_smi_order():  # type: ignore[no-untyped-def]
    """Two A100s and an L4: CUDA orders mixed models fastest first, so a launch names its GPUs
    by nvidia-smi's indices under CUDA_DEVICE_ORDER=PCI_BUS_ID; the L4 decides nothing it is not in."""
    pool = gpus_from(str(OWN / "nvidia-smi" / "csv-mixed-models-drivers.csv"))
    assert (
        pool.mixed
        and any("GPUs differ" in n for n in pool.notes)
        and any("drivers differ" in n for n in pool.notes)
    )
    s = shape_from_config(load_config(str(CONFIGS / "Qwen-Qwen3-32B.json")))
    p = plan(s, pool.count, 0.0, pool=pool, max_model_len=32768)
    assert p.fits and p.devices == (0,) and p.gpu_total_gib > 70  # an A100, not the 22 GiB L4
    assert launch_text(p).startswith("CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 vllm serve")
    three = plan(s, pool.count, 0.0, tp=3, pool=pool, max_model_len=32768)
    assert three.proposals[0].changes["tensor_parallel_size"] == 2
    assert three.proposals[0].changes["env:CUDA_VISIBLE_DEVICES"] == "0,1"
