"""What the launch path imports (issue 4: ``xpulaunch run`` adds at most 60 ms over the bare
program, and importing is most of what it adds).

A fresh interpreter runs the API path that ``xpulaunch run --gpus auto PROGRAM`` takes: probe
this host, plan, allocate the devices under the lease lock, and ``run_plan`` one real worker.
It does so twice: on this host's own inventory (CPU only here: ``auto`` runs on the CPU) and
on a CUDA inventory (a fixture of 8 H100s: the CUDA masks, a real lease of one device). Then
none of the stdlib modules below may have been imported: each costs 1-9 ms of start-up and
none is needed for launching. The probe's own tools and libraries are allowed to import what
they import where they are really used (see ``_allowed_on_this_host``).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from helpers import inventory_path

# Never on the launch path: each costs start-up time that issue 4's 60 ms budget cannot pay
# (dataclasses and inspect: xpulaunch._dataclass; click: the CLI's fast path, cli/spec.py).
FORBIDDEN = (
    "click",
    "dataclasses",
    "inspect",
    "typing",
    "pathlib",
    "shutil",
    "uuid",
    "ipaddress",
    "urllib",
    "tempfile",
    "random",
    "hashlib",
    "socket",
    "datetime",
    "platform",
    "email",
    "http",
)

_PATH = """
import json, os, sys
before = set(sys.modules)
from xpulaunch import api
from xpulaunch.core import inventory as inventory_doc
from xpulaunch.proc.launch import RunOptions, run_plan
from xpulaunch.proc.leases import LeaseManager

env = dict(os.environ)
worker = [sys.executable, "-c", "pass"]
statuses = []
inventory = api.probe(env)
manager = LeaseManager(sys.argv[1])
plan, lease = manager.allocate(
    lambda held: api.plan(worker, gpus="auto", inventory=inventory, parent_env=env,
                          unavailable=held)
)
with lease:
    statuses.append((plan.backend.value, run_plan(plan, env, RunOptions(), lease.fds)))
with open(sys.argv[2], encoding="utf-8") as handle:
    cuda = inventory_doc.loads(handle.read(), source="8x-h100.json")
plan, lease = manager.allocate(
    lambda held: api.plan(worker, gpus="1", inventory=cuda, parent_env=env, unavailable=held)
)
with lease:
    statuses.append((plan.backend.value, run_plan(plan, env, RunOptions(), lease.fds)))
json.dump({"statuses": statuses, "loaded": sorted(set(sys.modules) - before)}, sys.stderr)
"""


@pytest.fixture(scope="module")
def launch_path(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Run the launch path once in a fresh interpreter: exit statuses and modules loaded."""
    root = tmp_path_factory.mktemp("launch-imports")
    cuda = inventory_path("8x-h100.json")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", _PATH, str(root / "locks"), str(cuda)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stderr.splitlines()[-1])
    return result


_CLI = """
import json, sys
before = set(sys.modules)
from xpulaunch.cli.main import main
try:
    main(["--gpus", "auto", "--", sys.executable, "-c", "pass"])
except SystemExit as exc:
    status = exc.code
json.dump({"status": status, "loaded": sorted(set(sys.modules) - before)}, sys.stderr)
"""


@pytest.fixture(scope="module")
def cli_path(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """``xpulaunch --gpus auto PROGRAM`` (probe, lease, run) in a fresh interpreter."""
    root = tmp_path_factory.mktemp("cli-imports")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(root), "XPULAUNCH_LOCK_DIR": str(root / "locks")}
    done = subprocess.run(
        [sys.executable, "-c", _CLI], capture_output=True, text=True, timeout=60, env=env,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stderr.splitlines()[-1])
    assert result["status"] == 0
    return result


def _nvml_library_loads() -> bool:
    """Whether this host has the NVIDIA driver's NVML (what pynvml's nvmlInit loads)."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def _allowed_on_this_host() -> frozenset[str]:
    # On a host with the NVIDIA driver the probe really uses NVML, and nvidia-ml-py's pynvml
    # imports ctypes.util, which imports shutil and tempfile (and tempfile random). That is
    # pynvml's start-up cost, not ours; a host without the library must not pay it.
    return frozenset({"shutil", "tempfile", "random"}) if _nvml_library_loads() else frozenset()


def _loaded(launch_path: dict[str, object], name: str) -> list[str]:
    loaded = launch_path["loaded"]
    assert isinstance(loaded, list)
    return [m for m in loaded if m == name or m.startswith(name + ".")]


def test_the_launch_path_ran_both_plans(launch_path: dict[str, object]) -> None:
    host, cuda = launch_path["statuses"]  # type: ignore[misc]
    assert host[1] == 0  # "cpu" here; "cuda" on a host with NVIDIA GPUs
    assert cuda == ["cuda", 0]
    assert _loaded(launch_path, "xpulaunch.proc.supervisor")  # the real run_plan ran


@pytest.mark.parametrize("name", FORBIDDEN)
def test_the_launch_path_does_not_import(launch_path: dict[str, object], name: str) -> None:
    allowed = name in _allowed_on_this_host()  # pynvml's own imports, on an NVIDIA host
    assert allowed or _loaded(launch_path, name) == []


@pytest.mark.parametrize("name", FORBIDDEN)
def test_the_cli_does_not_import(cli_path: dict[str, object], name: str) -> None:
    allowed = name in _allowed_on_this_host()
    assert allowed or _loaded(cli_path, name) == []


def test_pynvml_only_where_the_nvml_library_loads(launch_path: dict[str, object]) -> None:
    """Without libnvidia-ml, the probe answers as pynvml would, without importing it; with
    it, the probe really asks NVML."""
    assert bool(_loaded(launch_path, "pynvml")) == _nvml_library_loads()


def test_forbidden_names_are_top_level_modules() -> None:
    # A typo here would make a test above pass without checking anything.
    for name in FORBIDDEN:
        assert "." not in name and __import__(name).__name__ == name
