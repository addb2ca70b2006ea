"""rules/taxonomy/taxonomy.yaml: the classes, layers and phases of DESIGN.md as data, each field checked."""

from __future__ import annotations

import copy
import os
import re

import pytest
import yaml

from diagnose.advice import core as advice
from diagnose.base.data_files import builtin_rules_dir
from diagnose.base.errors import RuleError
from diagnose.findings import hang, triage
from diagnose.model import records as model
from diagnose.model.taxonomy import TAXONOMY, load, parse
from diagnose.outputs import text as render

from .conftest import SHARED

PATH = os.path.join(builtin_rules_dir(), "taxonomy", "taxonomy.yaml")


def _data() -> dict:
    with open(PATH, encoding="utf-8") as f:
        return yaml.safe_load(f)


def test_every_module_reads_the_one_taxonomy():
    assert model.CLASS_LAYER is TAXONOMY.class_layer
    assert list(TAXONOMY.class_layer) == triage.CLASS_ORDER
    assert triage.LAYER_ORDER is TAXONOMY.layers
    assert advice.VERIFY is TAXONOMY.verify
    assert render.PHASE_LABEL is TAXONOMY.phase_label
    assert hang.HANG_BUDGET_S is TAXONOMY.hang_budget_s
    assert model.PHASES[0] == "start" and model.PHASES[-1] == "serving"


def test_the_classes_of_design_md_are_all_there():
    design = SHARED / "DESIGN.md"
    if not design.exists():
        pytest.skip("../shared/DESIGN.md not present")
    table = re.findall(r"^\| [\w—-]+ \| `(\w+)` \|", design.read_text(), flags=re.M)
    assert len(table) >= 13
    assert set(table) <= set(TAXONOMY.class_layer)


def test_a_class_added_in_the_file_is_known_everywhere(tmp_path):
    data = _data()
    data["classes"].insert(
        3, {"id": "host_oom", "layer": "memory", "verify": "dmesg shows no OOM killer line"}
    )
    tax = parse(data, str(tmp_path / "taxonomy.yaml"))
    assert tax.class_order.index("host_oom") == 3
    assert tax.class_layer["host_oom"] == "memory" and tax.verify["host_oom"].startswith("dmesg")


@pytest.mark.parametrize(
    "breaks, ident, fld",
    [
        (lambda d: d["classes"][0].pop("verify"), "gpu_busy", "verify"),
        (lambda d: d["classes"][2].update(layer="memry"), "oom", "layer"),
        (lambda d: d["phases"][4].pop("hang_budget_s"), "load_weights", "hang_budget_s"),
        (lambda d: d["phases"].pop(0), "start", "id"),
        (lambda d: d.update(oom_phases=["load"]), None, "oom_phases"),
    ],
)
def test_an_incomplete_file_is_named_by_file_id_and_field(tmp_path, breaks, ident, fld):
    data = copy.deepcopy(_data())
    breaks(data)
    path = tmp_path / "taxonomy.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(RuleError) as e:
        load(str(path))
    assert e.value.field == fld and e.value.rule_id == ident and str(path) in str(e.value)


HOST_OOM_RULE = """\
- id: host.oom-killer
  engines: [any]
  class: host_oom
  severity: fatal
  needles: ["Out of memory: Killed process"]
  pattern: 'Out of memory: Killed process (?P<pid>\\d+) \\((?P<proc>[^)]+)\\).*anon-rss:(?P<rss_kb>\\d+)kB'
  title: The kernel's OOM killer ended the server (host memory, not the GPU)
  advice:
    - param: swap_space
      to: "1"
      why: "process {proc} held {rss_kb} kB of host memory when the kernel killed it; the swap space is pinned host memory per GPU"
  examples:
    match:
      - "[Tue Dec  3 10:00:00 2026] Out of memory: Killed process 4242 (python3) total-vm:98765432kB, anon-rss:61234567kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:123456kB oom_score_adj:0"
    no_match:
      - "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
"""


def test_a_new_class_is_data_only_end_to_end(tmp_path):
    """A copy of the tool whose only change is data: a class in taxonomy.yaml and a rule for it.
    The scan types, orders, verifies and advises it with no code."""
    import shutil
    import subprocess
    import sys

    root = os.path.dirname(builtin_rules_dir()) if builtin_rules_dir().endswith("rules") else None
    assert root is not None
    shutil.copytree(
        os.path.join(root, "diagnose"), tmp_path / "diagnose", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(os.path.join(root, "rules"), tmp_path / "rules", ignore=shutil.ignore_patterns("mined"))
    os.symlink(os.path.join(root, "rules", "mined"), tmp_path / "rules" / "mined")
    data = _data()
    data["classes"].insert(
        1, {"id": "host_oom", "layer": "memory", "verify": "dmesg shows no OOM-killer line"}
    )
    with open(tmp_path / "rules" / "taxonomy" / "taxonomy.yaml", "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    (tmp_path / "rules" / "host.yaml").write_text(HOST_OOM_RULE)
    log = tmp_path / "serve.log"
    log.write_text(
        "INFO 05-26 18:53:37 [api_server.py:1043] vLLM API server version 0.8.5.post1\n"
        "[Tue Dec  3 10:00:00 2026] Out of memory: Killed process 4242 (python3) total-vm:98765432kB, "
        "anon-rss:61234567kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:123456kB oom_score_adj:0\n"
    )
    env = {**os.environ, "DIAGNOSE_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}
    p = subprocess.run(
        [sys.executable, "-m", "diagnose", "scan", "--json", str(log)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert p.returncode == 1, p.stderr
    doc = __import__("json").loads(p.stdout)
    primary = doc["primary"]
    assert primary["class"] == "host_oom" and primary["layer"] == "memory", primary
    first = doc["advice"][0]
    assert (
        first["param"] == "swap_space"
        and first["flag"] == "--swap-space"
        and first["verify"] == "dmesg shows no OOM-killer line"
    )
    assert "61234567 kB" in first["why"]
