"""The public surface: xpulaunch.__all__ is locked, every name resolves, and the Python API
does what the CLI does (contract section 5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import xpulaunch
from helpers import inventory_path

EXPECTED = {
    "Backend", "Device", "DeviceBusyError", "DeviceMap", "Event", "Exited", "GaveUp",
    "Hierarchy", "Inventory", "InventoryError", "LaunchError", "LaunchRequest", "Lease",
    "LeaseError", "LeaseManager", "LlamaServer", "LogConfig", "MaskError", "MigDevice", "Plan",
    "Probe", "ProbeError", "Problem", "Ready", "RestartMode", "RestartPolicy", "Restarting",
    "RunOptions", "SelectionError", "ServerStartError", "Started", "Stopped", "Stopping",
    "Supervisor", "Unhealthy", "Unit", "UsageError", "Vendor", "WaitTimeoutError",
    "WorkerFailedError", "WorkerPlan", "WorkerSpec", "WorkerState", "WorkerStatus",
    "XpulaunchError", "inventory_document", "load_inventory", "make_plan", "plan",
    "plan_document", "plan_llama", "probe", "run_plan", "serve_llama", "worker_specs",
}  # fmt: skip


def test_all_is_locked() -> None:
    assert set(xpulaunch.__all__) == EXPECTED
    assert set(xpulaunch._MODULE_OF) == EXPECTED  # every lazy name is public, and vice versa


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(xpulaunch, name) is not None
    assert name in dir(xpulaunch)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        xpulaunch.nope  # noqa: B018


def test_py_typed_ships() -> None:
    assert (Path(xpulaunch.__file__).parent / "py.typed").is_file()


def test_import_is_cheap_and_loads_no_supervisor_or_torch() -> None:
    code = (
        "import sys, xpulaunch; "
        "bad = [m for m in ('torch', 'psutil', 'xpulaunch.proc.supervisor', 'pynvml') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_plan_matches_the_cli_document() -> None:
    plan = xpulaunch.plan(
        ["python", "-c", "pass"], gpus="2", nproc_per_node=None, master_port=29511,
        inventory=str(inventory_path("2x-h200.json")), parent_env={},
    )  # fmt: skip
    doc = xpulaunch.plan_document(plan)
    assert doc["backend"] == "cuda" and len(doc["workers"]) == 2
    assert doc["workers"][1]["env"]["MASTER_PORT"] == "29511"


def test_supervisor_runs_a_planned_cpu_job(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    script = tmp_path / "job.py"
    script.write_text(
        f"import os\nopen({str(out)!r} + os.environ['RANK'], 'w').write(os.environ['WORLD_SIZE'])\n"
    )
    plan = xpulaunch.plan([str(script)], gpus="none", nproc_per_node=2, parent_env={})
    specs = xpulaunch.worker_specs(plan, {"PATH": "/usr/bin:/bin"})
    with xpulaunch.Supervisor(specs, xpulaunch.RestartPolicy(gang=True)) as supervisor:
        supervisor.start()
        assert supervisor.wait(timeout=60) == 0
    assert (tmp_path / "out.txt0").read_text() == "2"
    assert (tmp_path / "out.txt1").read_text() == "2"
