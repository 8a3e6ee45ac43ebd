"""A dry run refuses what the real run refuses, with the same line and status: this host's
leases (also under ``--inventory``), the ``--events`` and ``--log-dir`` paths, and torch for
c10d. Both go through ``xpulaunch.launch.preflight`` and the lease manager."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import inventory_path
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.launch.plan import load_inventory
from xpulaunch.leases import LeaseManager

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")
H200 = str(inventory_path("2x-h200.json"))


def xpulaunch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [XPULAUNCH, "run", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def both(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The dry run's and the real run's status and error line, checked to be the same."""
    dry = xpulaunch("--dry-run", *args, env=env)
    real = xpulaunch(*args, env=env)
    assert (dry.returncode, dry.stderr) == (real.returncode, real.stderr)
    assert "RAN" not in real.stdout
    return dry.returncode, dry.stderr.strip()


def test_a_device_leased_by_a_running_job_is_refused_by_both() -> None:
    """--inventory with this host's lock directory (XPULAUNCH_INVENTORY is how tests and
    GPU-less trials stand for this host's devices): the real run honours the lease, and so
    does the dry run now, instead of calling the leased device "chosen"."""
    inventory = load_inventory(H200)
    request = LaunchRequest(argv=("x",), gpus="device=0", master_port=29555)
    manager = LeaseManager(os.environ["XPULAUNCH_LOCK_DIR"])
    _, lease = manager.allocate(lambda held: make_plan(request, inventory, {}, unavailable=held))
    with lease:
        status, line = both("--inventory", H200, "--gpus", "device=0", "--", "echo", "RAN")
        assert status == 1 and "leased by pid" in line
        plan = xpulaunch("--dry-run", "--json", "--inventory", H200, "--", "true")
        assert plan.returncode == 0, plan.stderr
        doc = json.loads(plan.stdout)
        assert [d["index"] for d in doc["devices"]] == [1]
        assert any("leased by pid" in note for note in doc["notes"])


def test_with_wait_the_dry_run_shows_the_plan_it_would_wait_for() -> None:
    """The real run waits in line for the leased device (it is not refused), so its dry run
    shows the plan it gets once the lease ends, and that it waits first."""
    inventory = load_inventory(H200)
    request = LaunchRequest(argv=("x",), gpus="device=0", master_port=29555)
    manager = LeaseManager(os.environ["XPULAUNCH_LOCK_DIR"])
    _, lease = manager.allocate(lambda held: make_plan(request, inventory, {}, unavailable=held))
    with lease:
        args = ("--inventory", H200, "--gpus", "device=0", "--wait", "--", "true")
        done = xpulaunch("--dry-run", "--json", *args)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert [d["index"] for d in doc["devices"]] == [0]
        assert any(n.startswith("--wait: waits in line first (") for n in doc["notes"])
        waited = xpulaunch(*args[:-2], "--wait-timeout", "0.3", "--", "true")
        assert waited.returncode != 0 and "waiting" in waited.stderr  # it did wait


def test_shared_uses_a_leased_device_in_the_dry_run_too() -> None:
    inventory = load_inventory(H200)
    request = LaunchRequest(argv=("x",), gpus="device=0", master_port=29555)
    manager = LeaseManager(os.environ["XPULAUNCH_LOCK_DIR"])
    _, lease = manager.allocate(lambda held: make_plan(request, inventory, {}, unavailable=held))
    with lease:
        args = ("--inventory", H200, "--gpus", "device=0", "--shared", "--", "true")
        assert xpulaunch("--dry-run", *args).returncode == 0
        assert xpulaunch(*args).returncode == 0


@pytest.mark.parametrize(
    ("option", "path", "why"),
    [
        ("--events", "/nonexistent/dir/e.jsonl", "No such file or directory"),
        ("--log-dir", "/proc/x", ""),
        ("--events", "/proc/x", ""),
        ("--events", "/", "Is a directory"),
        ("--log-dir", "/etc/hostname/x", "Not a directory"),
    ],
)
def test_a_path_the_real_run_cannot_write_fails_the_dry_run(
    option: str, path: str, why: str
) -> None:
    status, line = both(option, path, "--gpus", "none", "--", "echo", "RAN")
    assert status == 2
    assert line.startswith(f"xpulaunch: error: {option} {path}: cannot ") and why in line


def test_paths_it_can_write_are_checked_without_creating_anything(tmp_path: Path) -> None:
    logs, events = tmp_path / "a" / "b", tmp_path / "ev" / "e.jsonl"
    (tmp_path / "ev").mkdir()
    done = xpulaunch(
        "--dry-run", "--log-dir", str(logs), "--events", str(events), "--gpus", "none", "--", "true"
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["ev"]


def test_c10d_without_torch_is_refused_by_both(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    c10d = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:41400", "--rdzv-id", "x"]
    status, line = both(
        "--gpus", "none", *c10d, "--nnodes", "1:2", "--", "echo", "RAN", env={"PYTHONPATH": path}
    )
    assert status == 2 and "torch is not installed" in line
