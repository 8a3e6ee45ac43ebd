"""``xpulaunch torchrun --standalone --nproc_per_node=2 examples/train.py``, for real: its
``--log-dir`` in torchrun's layout, and a job given only by torchrun's ``PET_*`` variables."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import wait_for
from node_helpers import EXAMPLES, HERE, Nodes, free_port, listening

pytestmark = [pytest.mark.slow, pytest.mark.torch]

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def the_run(log_dir: Path, run_id: str) -> Path:
    """The one ``<run_id>_<random>`` directory that torchrun's layout makes in ``log_dir``."""
    runs = list(log_dir.iterdir())
    assert len(runs) == 1 and re.fullmatch(run_id + r"_\w{8}", runs[0].name), runs
    return runs[0]


def log_text(folder: Path) -> str:
    return "".join(p.read_text() for p in sorted(folder.rglob("*.log")))


def test_torchrun_standalone_line_runs(nodes: Nodes, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    job = nodes.start(
        "torchrun", "--standalone", "--nproc_per_node=2", "--gpus", "none",
        str(EXAMPLES / "train.py"), "--ckpt-dir", str(tmp_path), "--steps", "4",
    )  # fmt: skip
    status, out, err = nodes.finish(job)
    assert status == 0, err
    assert sorted(re.findall(r"rank (\d)/2 local_rank (\d)", out)) == [("0", "0"), ("1", "1")]
    assert json.loads((tmp_path / "result.json").read_text())["world_size"] == 2


def test_log_dir_in_torchruns_layout_across_a_restart(nodes: Nodes, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    job = nodes.start(
        "torchrun", "--standalone", "--nproc_per_node=2", "--max-restarts=1", "--log_dir",
        str(logs), "--gpus", "none", str(EXAMPLES / "train.py"), "--ckpt-dir", str(ckpt),
        "--steps", "3", "--ckpt-every", "1", "--crash-at-step", "2",
    )  # fmt: skip
    status, _, err = nodes.finish(job)
    assert status == 0, err
    run = the_run(logs, UUID)  # --standalone: a new uuid, as torchrun names it
    names = sorted(p.name for p in run.iterdir())  # .running.lock: gone with the run
    assert names == ["attempt_0", "attempt_1", "summary.json"]
    first, second = run / "attempt_0", run / "attempt_1"
    assert sorted(p.name for p in first.iterdir()) == ["0", "1"]
    assert sorted(p.name for p in (first / "1").iterdir()) == ["stderr.log", "stdout.log"]
    # The lines exactly as the workers wrote them, each stream in its own file.
    assert (first / "0" / "stdout.log").read_text().startswith("rank 0/2 local_rank 0 ")
    assert "rank 1: simulated crash at step 2\n" in (first / "1" / "stderr.log").read_text()
    assert "simulated crash" not in (first / "1" / "stdout.log").read_text()
    assert "rank 0: resumed from step 1\n" in (second / "0" / "stdout.log").read_text()
    assert "rank 1: done at step 3 weights" in (second / "1" / "stdout.log").read_text()
    assert json.loads((run / "summary.json").read_text())["exit_code"] == 0
    shown = subprocess.run(
        [sys.executable, "-m", "xpulaunch", "logs", str(logs), "--rank", "1", "--attempt", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "rank 1: simulated crash at step 2" in shown.stdout


def test_a_failing_workers_error_json_is_where_torchrun_puts_it(
    nodes: Nodes, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    logs = tmp_path / "logs"
    job = nodes.start(
        "torchrun", "--nproc-per-node", "2", "--log-dir", str(logs), "--gpus", "none",
        str(HERE / "record_failure.py"),
    )  # fmt: skip
    status, _, err = nodes.finish(job)
    assert status == 1, err
    # A one-node line with no port: standalone for torchrun, whose run id is then a new uuid.
    attempt = the_run(logs, UUID) / "attempt_0"
    error = json.loads((attempt / "1" / "error.json").read_text())
    assert error["message"]["message"] == "ValueError: bad batch on local rank 1"
    assert not (attempt / "0" / "error.json").exists()
    assert (attempt / "0" / "stdout.log").read_text() == "local rank 0 to stdout\n"
    assert (attempt / "0" / "stderr.log").read_text() == "local rank 0 to stderr\n"
    assert "ValueError: bad batch" in (attempt / "1" / "stderr.log").read_text()
    assert "worker 1 failed first: it raised ValueError: bad batch on local rank 1" in err
    assert f"full log: {attempt / '1'}" in err


def test_a_job_given_only_by_pet_variables(
    nodes: Nodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    pet = {"PET_STANDALONE": "1", "PET_NPROC_PER_NODE": "2", "PET_LOG_DIR": str(logs),
           "PET_MAX_RESTARTS": "0"}  # fmt: skip
    for name, value in pet.items():  # what a PyTorchJob or a wrapper script sets
        monkeypatch.setenv(name, value)
    job = nodes.start(
        "torchrun", "--gpus", "none", str(EXAMPLES / "train.py"), "--ckpt-dir", str(ckpt),
        "--steps", "2",
    )  # fmt: skip
    status, out, err = nodes.finish(job)
    assert status == 0, err
    assert sorted(re.findall(r"rank (\d)/2 local_rank (\d)", out)) == [("0", "0"), ("1", "1")]
    attempt = the_run(logs, UUID) / "attempt_0"
    for rank in ("0", "1"):
        assert f"rank {rank}: done at step 2" in (attempt / rank / "stdout.log").read_text()


def test_two_c10d_nodes_log_dir_is_written_by_torchs_agent(nodes: Nodes, tmp_path: Path) -> None:
    """``--log-dir`` of a multi-node c10d job: torch's agent writes torchrun's layout (an
    attempt per restart, a folder per local rank), our supervisor nothing beside it; the
    console shows each worker's line once; ``xpulaunch logs`` reads the files."""
    pytest.importorskip("torch")
    port, ckpt = free_port(), tmp_path / "ckpt"
    logs = [tmp_path / "logs0", tmp_path / "logs1"]

    def node(log_dir: Path) -> subprocess.Popen[str]:
        return nodes.start(
            "torchrun", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job", "--max-restarts", "1",
            "--log-dir", str(log_dir), "--gpus", "none", str(EXAMPLES / "train.py"),
            "--ckpt-dir", str(ckpt), "--steps", "3", "--ckpt-every", "1", "--crash-at-step", "2",
        )  # fmt: skip

    node0 = node(logs[0])
    wait_for(lambda: listening(port), "node 0's rendezvous store", timeout_s=120)
    node1 = node(logs[1])
    results = [nodes.finish(node0), nodes.finish(node1)]
    assert [status for status, _, _ in results] == [0, 0], results[0][2][-3000:]
    out = "".join(out for _, out, _ in results)
    for rank in range(4):  # once each, not twice (the agent's tee, and no inherited stream)
        assert out.count(f"rank {rank}: done at step 3 weights") == 1, out
    for log_dir in logs:
        run = the_run(log_dir, "job")  # torchrun's name: the rendezvous id, and nothing else
        # The node whose worker crashed spends a restart (attempt_1). The other one's workers
        # either fail too (the same) or are restarted into the new round before they notice,
        # which spends no restart: torch then writes attempt_0 afresh.
        attempts = sorted(p.name for p in run.iterdir())
        assert attempts in (["attempt_0"], ["attempt_0", "attempt_1"]), attempts
        for attempt in attempts:
            assert sorted(p.name for p in (run / attempt).iterdir()) == ["0", "1"]
            for local_rank in ("0", "1"):
                files = sorted(p.name for p in (run / attempt / local_rank).iterdir())
                assert files[-2:] == ["stderr.log", "stdout.log"]  # and error.json on a crash
                last = (run / attempts[-1] / local_rank / "stdout.log").read_text()
                assert f"local_rank {local_rank} " in last and "done at step 3" in last
    crashed = [d for d in logs if "simulated crash" in log_text(the_run(d, "job") / "attempt_0")]
    assert len(crashed) == 1  # the last global rank: local rank 1 of one node
    assert (the_run(crashed[0], "job") / "attempt_1").is_dir()
    shown = subprocess.run(
        [sys.executable, "-m", "xpulaunch", "logs", str(crashed[0]), "--rank", "1",
         "--attempt", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "rank 3: simulated crash at step 2" in shown.stdout
