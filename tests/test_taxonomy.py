"""rules/taxonomy/taxonomy.yaml: the classes, layers and phases of DESIGN.md as data, each field checked."""

from __future__ import annotations

import copy
import os
import re

import pytest
import yaml

from diagnose import model, render, triage
from diagnose.advice import core as advice
from diagnose.errors import RuleError
from diagnose.shipped import builtin_rules_dir
from diagnose.taxonomy import TAXONOMY, load, parse

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
    assert triage.HANG_BUDGET_S is TAXONOMY.hang_budget_s
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
