"""The examples, run for real: DDP with torch (gloo on CPU) through supervise, and the API demo."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from xpulaunch import Backend, Plan, RestartMode, RunRequest, WorkerPlan
from xpulaunch.launch.request import Backoff
from xpulaunch.launch.run import supervise

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("CUDA_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "HIP_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))


def ddp_plan(ckpt: Path, *extra: str) -> Plan:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = (sys.executable, str(EXAMPLES / "train.py"), "--ckpt-dir", str(ckpt), *extra)
    workers = tuple(
        WorkerPlan(
            str(rank),
            rank,
            rank,
            argv,
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
                # As the planner's CPU plans do: on a GPU host the example would pick nccl.
                "CUDA_VISIBLE_DEVICES": "",
            },
        )
        for rank in range(2)
    )
    return Plan(Backend.CPU, (), workers, None)


@pytest.mark.torch
def test_ddp_crash_gang_restart_and_resume(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    options = RunRequest(
        program=("train.py",), restart=RestartMode.ON_FAILURE, max_restarts=1, backoff=Backoff(0)
    )
    reference = tmp_path / "reference"
    assert supervise(ddp_plan(reference), options, dict(os.environ)) == 0
    capfd.readouterr()

    crashed = tmp_path / "crashed"
    plan = ddp_plan(crashed, "--crash-at-step", "12", "--ckpt-every", "5")
    assert supervise(plan, options, dict(os.environ)) == 0
    captured = capfd.readouterr()
    out, err = captured.out, captured.err
    assert "[1] rank 1: simulated crash at step 12" in err
    assert "worker 1 exited with code 3; restarting all workers" in err
    assert "[0] rank 0: resumed from step 10" in out
    assert "[1] rank 1: resumed from step 10" in out
    assert "restart 1" in out  # TORCHELASTIC_RESTART_COUNT reached the workers
    # Steps 11 and 12 ran again after the resume. (Whether rank 0 printed step 11 before the
    # crash is a race: the gang stop may end it between the all-reduce and the print.)
    resumed = out.split("[0] rank 0: resumed from step 10", 1)[1]
    assert "[0] step 11 loss" in resumed and "[0] step 12 loss" in resumed
    assert "backend gloo" in out
    ref = json.loads((reference / "result.json").read_text())
    got = json.loads((crashed / "result.json").read_text())
    assert got == ref  # same weights as the run that never crashed
    assert got["steps"] == 20 and got["world_size"] == 2


@pytest.mark.torch
def test_ddp_gives_up_when_no_restart_is_allowed(tmp_path: Path, capfd: pytest.CaptureFixture):
    pytest.importorskip("torch")
    plan = ddp_plan(tmp_path / "ckpt", "--crash-at-step", "3", "--steps", "5")
    assert supervise(plan, RunRequest(program=("train.py",)), dict(os.environ)) == 3
    err = capfd.readouterr().err
    assert "worker 1 failed first: it exited with code 3" in err
    assert "rank 1: simulated crash at step 3" in err
    assert not (tmp_path / "ckpt" / "result.json").exists()


def test_supervisor_api_example(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "supervisor_api.py")],
        check=False, capture_output=True, text=True, timeout=120, env={**os.environ},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "killed server a; waiting for its restart" in result.stdout
    assert "a: ready again, restarts 1" in result.stdout
    assert "stopped, exit status 0" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_examples_import_only_the_public_package(example: str) -> None:
    """Examples are what users copy: they use ``xpulaunch``'s public names, never internals
    (``xpulaunch.integrations.*`` are public: optional glue, imported by its own path)."""
    import ast

    tree = ast.parse((EXAMPLES / example).read_text())
    internal = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("xpulaunch.")
    ]
    internal += [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith("xpulaunch.")
    ]
    assert [name for name in internal if not name.startswith("xpulaunch.integrations.")] == []


@pytest.mark.torch
def test_the_readme_torchrun_line_runs_with_the_shipped_example(tmp_path: Path) -> None:
    """README: ``xpulaunch torchrun --standalone --nproc_per_node=2 train.py --lr 0.1``; the
    train.py a new user has is this one, which used to refuse ``--lr``."""
    pytest.importorskip("torch")
    argv = [sys.executable, "-m", "xpulaunch", "torchrun", "--standalone", "--nproc_per_node=2",
            str(EXAMPLES / "train.py"), "--lr", "0.1", "--steps", "3",
            "--ckpt-dir", str(tmp_path / "ckpt")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done at step 3" in done.stdout
