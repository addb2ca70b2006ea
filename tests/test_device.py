"""nvidia-smi snapshots: the three formats, the one-line conclusion, the warnings, bad input."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.host.gpus import DeviceError, apply_visible_devices
from diagnose.host.nvidia_smi import parse_apps_csv, parse_nvidia_smi

from .conftest import FIXTURES, REFERENCE, ROOT, run

SMI = FIXTURES / "nvidia-smi"
EXPECT = yaml.safe_load((SMI / "expect.yaml").read_text())


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_conclusion_and_warnings(name):
    want = EXPECT[name]
    snap = parse_nvidia_smi((SMI / name).read_text())
    assert snap.summary() == want["summary"]
    assert [w.kind for w in snap.warnings(4)] == want["warnings"]
    if "processes" in want:
        assert [len(g.processes) for g in snap.gpus] == want["processes"]


def test_processes_and_fields_from_the_table():
    snap = parse_nvidia_smi((SMI / "table-2x-a100-550-busy.txt").read_text())
    g0 = snap.gpus[0]
    assert (g0.index, g0.bus_id, g0.memory_used_mib, g0.memory_total_mib) == (
        0,
        "00000000:07:00.0",
        40323,
        81920,
    )
    assert (g0.processes[0].pid, g0.processes[0].name, g0.processes[0].used_mib) == (
        3888866,
        "python3",
        40312,
    )
    assert snap.cuda_version == "12.4" and snap.source == "table"
    q = parse_nvidia_smi((SMI / "query-q-1x-a100-busy.txt").read_text())
    assert q.gpus[0].uuid.startswith("GPU-8c1f") and q.gpus[0].memory_free_mib == 8451 and q.source == "query"


@pytest.mark.skipif(not (REFERENCE / "nvidia-smi").is_dir(), reason="../shared/reference not present")
@pytest.mark.parametrize(
    "name,count,total_gib,busy",
    [
        ("01-rtx3060-laptop-table-no-processes.txt", 1, 6.0, False),
        ("02-rtx-a6000-table.txt", 1, 48.0, False),
        ("03-rtx-a6000-x2-csv-with-compute-apps.txt", 2, 48.0, False),
        ("04-h200-x1-csv.txt", 1, 140.4, False),
        ("05-quadro-rtx4000-csv-busy.txt", 1, 8.0, True),
        ("06-l4-x1-csv-with-driver.txt", 1, 22.5, False),
    ],
)
def test_real_reference_outputs(name, count, total_gib, busy):
    snap = parse_nvidia_smi((REFERENCE / "nvidia-smi" / name).read_text())
    assert snap.count == count and snap.gpus[0].total_gib == total_gib
    assert ("busy" in [w.kind for w in snap.warnings()]) == busy


@pytest.mark.parametrize("name", ["no-devices.txt", "no-driver.txt", "lost-gpu-handle.txt"])
def test_no_gpu_outputs_are_driver_errors(name):
    with pytest.raises(DeviceError) as e:
        parse_nvidia_smi((SMI / name).read_text())
    assert e.value.driver


@pytest.mark.parametrize(
    "text,msg",
    [
        ("", "empty"),
        ("index, name, memory.total [MiB]\n0, NVIDIA A100", "fields"),
        ((SMI / "table-2x-a100-550-busy.txt").read_text().split("| N/A   34C")[0], "no memory line"),
        ("hello world\nthis is not nvidia-smi\n", "GPU name and memory.total columns"),
        (
            "gpu_bus_id, pid, process_name, used_gpu_memory [MiB]\n00000000:07:00.0, 1234, python3, 40312 MiB\n",
            "processes only",
        ),
    ],
)
def test_garbled_output_is_a_clean_error(text, msg):
    with pytest.raises(DeviceError, match=msg):
        parse_nvidia_smi(text)


def test_compute_apps_csv():
    procs = parse_apps_csv(
        "gpu_bus_id, pid, process_name, used_gpu_memory [MiB]\n00000000:07:00.0, 1234, python3, 40312 MiB\n"
    )
    assert [(p.pid, p.name, p.used_mib, p.bus_id) for p in procs] == [
        (1234, "python3", 40312, "00000000:07:00.0")
    ]


def test_cuda_visible_devices_narrows_the_view():
    snap = parse_nvidia_smi((SMI / "table-8x-h100-570.txt").read_text())
    two = apply_visible_devices(snap, "2,3")
    assert two.count == 2 and [g.index for g in two.gpus] == [2, 3]
    assert any(w.kind == "visible_devices" and "hides GPU 0,1,4,5,6,7" in w.text for w in two.warnings())
    bad = apply_visible_devices(snap, "0,9,1")
    assert bad.count == 1 and any("names 9" in w.text for w in bad.warnings())


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=600))
def test_fuzz_any_text_gives_a_snapshot_or_a_clean_error(text):
    try:
        snap = parse_nvidia_smi(text)
    except DeviceError:
        return
    assert snap.count >= 1 and isinstance(snap.summary(), str)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=5000), st.integers(min_value=1, max_value=4000))
def test_fuzz_truncated_real_outputs(cut_at, drop):
    for name in ("table-2x-a100-550-busy.txt", "query-q-1x-a100-busy.txt", "csv-seed-2x-a100.csv"):
        text = (SMI / name).read_text()
        text = text[:cut_at] + text[cut_at + drop :]
        with contextlib.suppress(DeviceError):
            parse_nvidia_smi(text)


def test_device_command(cli):
    p = run([*cli, "device", str(SMI / "table-2x-a100-550-busy.txt"), "--tp", "4"])
    out = p.stdout.decode()
    assert p.returncode == 1 and out.splitlines()[0] == EXPECT["table-2x-a100-550-busy.txt"]["summary"]
    assert "busy: GPU 0 has 39.4 GiB in use (pid 3888866 python3 39.4 GiB)" in out
    p = run([*cli, "device", "--json", "-"], stdin=(SMI / "csv-noheader-nounits-4x-l40s.csv").read_bytes())
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["count"] == 4 and doc["warnings"] == []
    assert set(doc["gpus"][0]) >= {
        "index",
        "name",
        "memory_total_mib",
        "memory_used_mib",
        "driver_version",
        "processes",
    }
    p = run([*cli, "device", str(SMI / "no-driver.txt")])
    assert p.returncode == 2 and b"NVIDIA driver" in p.stderr and b"Traceback" not in p.stderr


def test_device_places_a_launch_off_the_busy_gpus(cli):
    """`device --tp N`: when the first N GPUs (the engine's own pick) hold a busy one and others
    are free, the CUDA_VISIBLE_DEVICES that avoids it (the placement plan and check use)."""
    snap = str(SMI / "csv-4x-h100-one-busy.csv")
    p = run([*cli, "device", "--json", snap, "--tp", "2"], env=_no_cvd())
    doc = json.loads(p.stdout)
    assert doc["placement"]["cuda_visible_devices"] == "1,2" and doc["placement"]["devices"] == [1, 2]
    out = run([*cli, "device", snap, "--tp", "3"], env=_no_cvd()).stdout.decode()
    assert "CUDA_VISIBLE_DEVICES=1,2,3 runs 3 GPUs without the busy GPU 0" in out
    assert "placement" not in json.loads(
        run([*cli, "device", "--json", snap, "--tp", "4"], env=_no_cvd()).stdout
    )


def _no_cvd() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}


def test_scan_cross_check(cli):
    log = FIXTURES / "logs" / "vllm" / "healthy-v1-tp4-interleaved-docker.log"
    p = run([*cli, "scan", "--json", str(log), "--gpus", str(SMI / "csv-seed-2x-a100.csv")])
    doc = json.loads(p.stdout)
    assert doc["device"]["count"] == 2 and doc["device"]["summary"].startswith("2 GPUs visible")
    assert {"kind": "too_few_gpus", "text": "the parallel size asks for 4 GPUs but 2 are visible"} in doc[
        "device"
    ]["warnings"]
    assert doc["primary"]["rule"] == "device.too-few-gpus" and doc["primary"]["class"] == "tp_mismatch"
    p = run([*cli, "scan", str(log), "--gpus", str(SMI / "csv-seed-2x-a100.csv")])
    assert "gpus      2 GPUs visible" in p.stdout.decode()


def test_scan_busy_gpu_turns_oom_into_gpu_busy(cli):
    log = FIXTURES / "logs" / "vllm" / "oom-load-v0-other-process.log"
    doc = json.loads(
        run([*cli, "scan", "--json", str(log), "--gpus", str(SMI / "table-2x-a100-550-busy.txt")]).stdout
    )
    assert doc["primary"]["class"] == "gpu_busy" and doc["advice"][0]["param"] == "action:free_gpu"
    assert "3888866" in doc["advice"][0]["why"]
    assert any(c["param"] == "env:CUDA_VISIBLE_DEVICES" and c["to"] == "1" for c in doc["advice"])


def test_scan_snapshot_without_driver_is_a_driver_finding(cli):
    log = FIXTURES / "logs" / "vllm" / "healthy-v0-061-ready.log"
    p = run([*cli, "scan", "--json", str(log), "--gpus", str(SMI / "no-driver.txt")])
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["primary"]["class"] == "driver" and doc["device"] is None


def test_scan_with_garbled_snapshot_is_exit_2(cli, tmp_path):
    bad = tmp_path / "smi.txt"
    bad.write_text("what is this\n")
    p = run([*cli, "scan", str(FIXTURES / "logs" / "vllm" / "healthy-v0-061-ready.log"), "--gpus", str(bad)])
    assert p.returncode == 2 and str(bad).encode() in p.stderr and b"Traceback" not in p.stderr


def test_device_runs_nvidia_smi_when_on_path(cli, tmp_path):
    """No input: the seed's query is run (here a stand-in nvidia-smi that prints a real format)."""
    fake = tmp_path / "nvidia-smi"
    csv_text = (SMI / "csv-seed-2x-a100.csv").read_text()
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f"  *--query-gpu=index,name,memory.total,memory.used,driver_version*) cat <<'X'\n{csv_text}X\n;;\n"
        "  *--query-compute-apps*) printf 'gpu_bus_id, pid, process_name, used_gpu_memory [MiB]\\n' ;;\n"
        "  *) exit 9 ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    p = subprocess.run(
        [*cli, "device"], capture_output=True, env=env, cwd=ROOT, timeout=60, stdin=subprocess.DEVNULL
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().splitlines()[0] == EXPECT["csv-seed-2x-a100.csv"]["summary"]
    env["PATH"] = str(tmp_path / "nothing-here")
    p = subprocess.run(
        [*cli, "device"], capture_output=True, env=env, cwd=ROOT, timeout=60, stdin=subprocess.DEVNULL
    )
    assert p.returncode == 2 and b"nvidia-smi is not on PATH" in p.stderr and b"--query-gpu" in p.stderr


V100_ROWS = [
    (i, "Tesla V100-SXM2-32GB", 32764 if i == 3 else 32768) for i in range(8)
]  # real V100s differ by a few MiB


def _csv(rows: list[tuple[int, str, int]]) -> str:
    head = "index, name, memory.total [MiB], memory.used [MiB], driver_version\n"
    return head + "".join(f"{i}, {n}, {t} MiB, 0 MiB, 535.183.01\n" for i, n, t in rows)


def test_cards_of_one_model_a_few_mib_apart_are_not_mixed():  # type: ignore[no-untyped-def]
    snap = parse_nvidia_smi(_csv(V100_ROWS))
    assert not [w for w in snap.warnings() if w.kind == "mixed_model"]
    assert "Tesla V100-SXM2-32GB ×8, 32.0 GiB each" in snap.summary()


def test_mixed_model_names_only_the_groups_that_differ():  # type: ignore[no-untyped-def]
    rows = [*V100_ROWS[:7], (7, "Tesla V100-SXM2-16GB", 16160)]
    (w,) = [w for w in parse_nvidia_smi(_csv(rows)).warnings() if w.kind == "mixed_model"]
    assert "GPU 0,1,2,3,4,5,6: Tesla V100-SXM2-32GB 32.0 GiB; GPU 7: Tesla V100-SXM2-16GB 15.8 GiB" in w.text


def test_windows_mig_unified_and_list_outputs_read_right():  # type: ignore[no-untyped-def]
    """Layouts beyond Linux's default table: Windows (WDDM in the persistence column, processes
    without a memory figure), MIG instances (what CUDA sees), unified memory that nvidia-smi does
    not size (GB10: "Not Supported", "[N/A]"), and `nvidia-smi -L`."""
    win = parse_nvidia_smi((SMI / "table-1x-4090-windows-wddm.txt").read_text())
    assert win.gpus[0].memory_total_mib == 24564
    assert [p.pid for p in win.gpus[0].processes] == [1234, 5678]
    assert win.gpus[0].processes[0].used_mib is None
    mig = parse_nvidia_smi((SMI / "table-1x-a100-525-mig.txt").read_text())
    assert mig.gpus[0].mig_mib == [40192, 19968]
    assert "MIG instances" in mig.warnings()[0].text
    listed = parse_nvidia_smi((SMI / "list-2x-a100-mig.txt").read_text())
    assert [g.name for g in listed.gpus] == ["NVIDIA A100-SXM4-80GB"] * 2
    assert listed.gpus[0].mig_mib == [40000, 20000] and listed.gpus[1].mig_mib == []
    for name in ("table-1x-gb10-580-unified.txt", "csv-1x-gb10-na.csv"):
        gb10 = parse_nvidia_smi((SMI / name).read_text())
        assert gb10.gpus[0].unified and gb10.gpus[0].memory_total_mib is None
        assert gb10.to_json()["gpus"][0]["memory"].startswith("not reported")


def test_plan_takes_a_mig_instance_and_refuses_a_snapshot_without_sizes(cli):  # type: ignore[no-untyped-def]
    cfg = str(REFERENCE / "configs" / "Qwen-Qwen3-8B.json")
    if not (REFERENCE / "configs").is_dir():
        pytest.skip("../shared/reference is not here")
    for name, mib in (("table-1x-a100-525-mig.txt", 19968), ("list-2x-a100-mig.txt", 20000)):
        r = run([*cli, "plan", "--json", "--config", cfg, "--gpus", str(SMI / name)], text=True)
        doc = json.loads(r.stdout)
        assert doc["gpus"] == 1 and doc["gpu_total_gib"] == pytest.approx(mib / 1024)  # one instance
    listed = (SMI / "list-2x-a100-mig.txt").read_text()
    plain = "\n".join(x for x in listed.splitlines() if "MIG" not in x)
    r = run([*cli, "plan", "--config", cfg, "--gpus", "/dev/stdin"], stdin=plain, text=True)
    assert r.returncode == 2 and "e.g. --gpus 2x80" in r.stderr  # the name says 80GB
    r = run([*cli, "plan", "--config", cfg, "--gpus", str(SMI / "csv-1x-gb10-na.csv")], text=True)
    assert r.returncode == 2 and "unified memory" in r.stderr and "Traceback" not in r.stderr


def test_the_drivers_reserve_is_what_cuda_does_not_see(cli):  # type: ignore[no-untyped-def]
    """-q prints the memory the driver reserves (FB Memory Usage → Reserved): total less reserve
    is the 79.18 GiB vLLM logs on an H100 (81,559 − 481 MiB). Without it the plan takes off a
    typical reserve and says so."""
    if not (REFERENCE / "configs").is_dir():
        pytest.skip("../shared/reference is not here")
    cfg = str(REFERENCE / "configs" / "Qwen-Qwen3-8B.json")
    r = run(
        [*cli, "plan", "--json", "--config", cfg, "--gpus", str(SMI / "query-q-1x-h100-reserved.txt")],
        text=True,
    )
    assert json.loads(r.stdout)["gpu_total_gib"] == pytest.approx(79.18, abs=0.01)
    r = run([*cli, "plan", "--config", cfg, "--gpus", str(SMI / "table-8x-h100-570.txt")], text=True)
    assert "typical of the driver's reserve" in r.stdout
    # `-q -d MEMORY` on A100 80GB: 81,920 − 768 MiB reserved = the 79.25 GiB vLLM logs there
    r = run(
        [*cli, "plan", "--json", "--config", cfg, "--gpus", str(SMI / "query-q-memory-only-2x-a100.txt")],
        text=True,
    )
    assert json.loads(r.stdout)["gpu_total_gib"] == pytest.approx(79.25, abs=0.01)


def test_a_gpu_that_reads_err_does_not_count_for_the_parallel_size():  # type: ignore[no-untyped-def]
    snap = parse_nvidia_smi((SMI / "table-2x-a100-550-err.txt").read_text())
    assert [g.error for g in snap.gpus] == [False, True]
    kinds = [w.kind for w in snap.warnings(2)]
    assert kinds == ["gpu_error", "too_few_gpus"]
    assert "1 of them cannot be read" in snap.warnings(2)[1].text
    assert [w.kind for w in snap.warnings(1)] == ["gpu_error"]
