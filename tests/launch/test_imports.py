"""What a launch loads into the process that supervises the job for its whole life.

A fresh interpreter runs the path that ``xpulaunch run --gpus auto PROGRAM`` takes, twice: the
API (probe this host, plan, allocate the devices under the lease lock, ``supervise`` one real
worker; on this host's inventory and on a CUDA inventory of 8 H100s, with a real lease of one
device), and the CLI itself. Then:

* no torch, accelerate or vendor GPU runtime: the launcher never initialises a GPU (a CUDA
  context does not survive ``fork``, and importing torch costs seconds of every launch);
* no pynvml in the CLI's process: it probes in a forked child, so NVML's library is not
  resident in the supervisor for the life of the job (:mod:`xpulaunch.probing.isolated`);
* no ``http.client``, ``ssl`` or ``email`` for a plain ``run``: only llama health checks
  speak HTTP, and they import it when they run;
* at most :data:`MAX_MODULES` of our own modules when the CLI starts its first worker (on
  this host and on 8 H100s): a plain run loads what it uses, and a mode it does not use
  (several nodes, c10d, ``--cpu-bind``, slots, waiting in line, another vendor's masks, health
  checks) is imported where that mode begins.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import inventory_path

# GPU runtimes and frameworks: a launcher that imports one of them initialises (or at least
# loads) a GPU stack in the process that forks the workers.
GPU_RUNTIMES = ("torch", "accelerate", "intel_extension_for_pytorch", "cupy", "pycuda", "pyzes")
HTTP = ("http.client", "ssl", "email")
# Our modules (package __init__ files included) loaded when the CLI starts the first worker of
# a plain run. A bound to keep, and to lower when a change loads fewer.
MAX_MODULES = 60

# Notes which of our modules are loaded when the first worker is started: the first Popen
# made by processes/spawn.py's spawn() (the guardian and the probe start otherwise).
_AT_FIRST_SPAWN = """
import subprocess, sys
at_spawn = []
_popen_init = subprocess.Popen.__init__

def _noting(self, *args, **kwargs):
    frame = sys._getframe(1)
    while frame is not None and not at_spawn:
        code = frame.f_code
        if code.co_name == "spawn" and code.co_filename.endswith("processes/spawn.py"):
            at_spawn.append(sorted(m for m in sys.modules if m.split(".")[0] == "xpulaunch"))
        frame = frame.f_back
    _popen_init(self, *args, **kwargs)

subprocess.Popen.__init__ = _noting
"""

_API = """
import json, os, sys
before = set(sys.modules)
from xpulaunch import api
from xpulaunch.core import inventory as inventory_doc
from xpulaunch.launch.request import RunRequest
from xpulaunch.launch.run import supervise
from xpulaunch.leases import LeaseManager

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
    status = supervise(plan, RunRequest(program=('w',)), env, lease_fds=lease.fds)
    statuses.append((plan.backend.value, status))
with open(sys.argv[2], encoding="utf-8") as handle:
    cuda = inventory_doc.loads(handle.read(), source="8x-h100.json")
plan, lease = manager.allocate(
    lambda held: api.plan(worker, gpus="1", inventory=cuda, parent_env=env, unavailable=held)
)
with lease:
    status = supervise(plan, RunRequest(program=('w',)), env, lease_fds=lease.fds)
    statuses.append((plan.backend.value, status))
json.dump({"statuses": statuses, "loaded": sorted(set(sys.modules) - before)}, sys.stderr)
"""

_CLI = (
    _AT_FIRST_SPAWN
    + """
import json, sys
before = set(sys.modules)
from xpulaunch.cli.main import main
try:
    main(["--gpus", "auto", *sys.argv[1:], "--", sys.executable, "-c", "pass"])
except SystemExit as exc:
    status = exc.code
json.dump({"status": status, "loaded": sorted(set(sys.modules) - before),
           "at_spawn": at_spawn[0]}, sys.stderr)
"""
)


def _run(code: str, *args: str, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
        env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stderr.splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def api_path(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The API's launch path, in a fresh interpreter: exit statuses and modules loaded."""
    root = tmp_path_factory.mktemp("api-imports")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(root)}
    return _run(_API, str(root / "locks"), str(inventory_path("8x-h100.json")), env=env)


@pytest.fixture(scope="module")
def cli_path(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """``xpulaunch --gpus auto PROGRAM`` (probe, lease, run) in a fresh interpreter."""
    root = tmp_path_factory.mktemp("cli-imports")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(root), "XPULAUNCH_LOCK_DIR": str(root / "locks")}
    result = _run(_CLI, env=env)
    assert result["status"] == 0
    return result


@pytest.fixture(scope="module")
def cli_cuda_path(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The same command on a host of 8 H100s (its inventory document, with real leases)."""
    root = tmp_path_factory.mktemp("cli-cuda-imports")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(root), "XPULAUNCH_LOCK_DIR": str(root / "locks")}
    result = _run(_CLI, "--inventory", str(inventory_path("8x-h100.json")), env=env)
    assert result["status"] == 0
    return result


def _loaded(path: dict[str, object], name: str) -> list[str]:
    loaded = path["loaded"]
    assert isinstance(loaded, list)
    return [m for m in loaded if m == name or m.startswith(name + ".")]


def test_the_api_path_ran_both_plans(api_path: dict[str, object]) -> None:
    host, cuda = api_path["statuses"]  # type: ignore[misc]
    assert host[1] == 0  # "cpu" here; "cuda" on a host with NVIDIA GPUs
    assert cuda == ["cuda", 0]
    assert _loaded(api_path, "xpulaunch.supervisor.supervisor")  # the real supervise ran


def test_the_cli_ran_the_supervisor(cli_path: dict[str, object]) -> None:
    assert _loaded(cli_path, "xpulaunch.supervisor.supervisor")


@pytest.mark.parametrize("name", GPU_RUNTIMES)
def test_no_gpu_runtime_is_imported(
    api_path: dict[str, object], cli_path: dict[str, object], name: str
) -> None:
    assert _loaded(api_path, name) == []
    assert _loaded(cli_path, name) == []


def test_nvml_is_not_resident_in_the_cli_supervisor(cli_path: dict[str, object]) -> None:
    assert _loaded(cli_path, "pynvml") == []


@pytest.mark.parametrize("name", HTTP)
def test_a_plain_run_does_not_speak_http(
    api_path: dict[str, object], cli_path: dict[str, object], name: str
) -> None:
    assert _loaded(api_path, name) == []
    assert _loaded(cli_path, name) == []


def test_a_plain_run_starts_its_first_worker_with_few_modules_loaded(
    cli_path: dict[str, object], cli_cuda_path: dict[str, object]
) -> None:
    paths = {"this host": cli_path, "8 H100s": cli_cuda_path}
    at_spawn = {name: path["at_spawn"] for name, path in paths.items()}
    for loaded in at_spawn.values():
        assert isinstance(loaded, list)
        assert "xpulaunch.processes.spawn" in loaded  # noted at the real spawn
    counts = {name: len(loaded) for name, loaded in at_spawn.items()}  # type: ignore[arg-type]
    assert max(counts.values()) <= MAX_MODULES, (counts, at_spawn)


def test_the_names_checked_are_real_modules() -> None:
    # A typo above would make a test pass without checking anything.
    for name in HTTP:
        assert __import__(name, fromlist=["_"]).__name__ == name
