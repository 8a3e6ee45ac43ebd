"""SIGKILL the supervisor: no worker and no grandchild may survive it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import lock_is_free
from process_kit import alive, pids_in, wait_for
from xpulaunch.processes import records

Argv = Callable[..., list[str]]
Drive = Callable[..., subprocess.Popen[str]]


@pytest.mark.parametrize("round_", range(5))
def test_sigkill_of_the_supervisor_leaves_nothing(
    child: Argv, drive: Drive, tmp_path: Path, round_: int
) -> None:
    out = tmp_path / "pids"
    out.mkdir()
    # Workers that ignore SIGTERM and each leave a child and a setsid grandchild.
    proc = drive([child("tree.py", out, "--ignore-term")] * 2, grace_s=60)
    wait_for(lambda: len(pids_in(out)) == 6)
    pids = pids_in(out)
    proc.kill()
    proc.wait(timeout=10)
    wait_for(lambda: not [p for p in pids if alive(p)], timeout_s=20)


def _job_files(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "xpulaunch" / "jobs").glob("*.jsonl"))


def test_guardian_holds_the_lease_until_the_job_is_gone(child: Argv, tmp_path: Path) -> None:
    out = tmp_path / "pids"
    out.mkdir()
    lease = tmp_path / "lease.lock"
    script = tmp_path / "leased_driver.py"
    # A parent like `xpulaunch run`: takes a lease (flock), passes it as lease_fds.
    script.write_text(
        "import fcntl, os, sys\n"
        "from xpulaunch.model import Backend, Plan, WorkerPlan\n"
        "from xpulaunch.launch.request import RunRequest\n"
        "from xpulaunch.launch.run import supervise\n"
        f"fd = os.open({str(lease)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        f"argv = tuple({child('tree.py', out, '--ignore-term')!r})\n"
        "plan = Plan(Backend.CPU, (), (WorkerPlan('0', 0, 0, argv, {}),), None)\n"
        "request = RunRequest(program=('job',), grace_s=60)\n"
        "sys.exit(supervise(plan, request, dict(os.environ), lease_fds=(fd,)))\n"
    )
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    proc = subprocess.Popen([os.sys.executable, str(script)], env=env)
    wait_for(lambda: len(pids_in(out)) == 3)
    pids = pids_in(out)
    proc.kill()
    proc.wait(timeout=10)

    def lease_free() -> bool:
        if not lock_is_free(lease):
            return False
        # The lease became free: by then every process of the job must be gone.
        assert not [p for p in pids if alive(p)]
        return True

    wait_for(lease_free, timeout_s=20)
    wait_for(lambda: not _job_files(tmp_path))  # the guardian removed the record


def test_record_sweep_when_the_guardian_died_too(child: Argv, drive: Drive, tmp_path: Path) -> None:
    out = tmp_path / "pids"
    out.mkdir()
    proc = drive([child("tree.py", out)], grace_s=60)
    wait_for(lambda: len(pids_in(out)) == 3)
    (record,) = _job_files(tmp_path)
    head = json.loads(record.read_text().splitlines()[0])
    proc.send_signal(signal.SIGSTOP)  # dying with it: a stopped supervisor starts no new one
    os.kill(head["guardian"][0], signal.SIGKILL)
    wait_for(lambda: not alive(head["guardian"][0]))
    proc.kill()
    proc.wait(timeout=10)
    (worker,) = pids_in(out, "worker")
    wait_for(lambda: not alive(worker))  # PR_SET_PDEATHSIG took the direct worker
    (grandchild,) = pids_in(out, "setsid")
    assert alive(grandchild)  # the setsid grandchild is beyond pdeathsig's reach
    assert records.sweep(tmp_path / "xpulaunch" / "jobs") >= 1
    wait_for(lambda: not [p for p in pids_in(out) if alive(p)])
    assert not _job_files(tmp_path)


def _run_dirs(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "xpulaunch" / "jobs").glob("*.run"))


def test_a_killed_guardian_is_replaced_and_the_new_one_does_its_job(
    child: Argv, drive: Drive, tmp_path: Path
) -> None:
    out = tmp_path / "pids"
    out.mkdir()
    proc = drive([child("tree.py", out, "--ignore-term")], grace_s=60)
    wait_for(lambda: len(pids_in(out)) == 3)
    pids = pids_in(out)
    (record,) = _job_files(tmp_path)
    first = json.loads(record.read_text().splitlines()[0])["guardian"][0]
    os.kill(first, signal.SIGKILL)

    def new_guardian() -> int | None:
        lines = [json.loads(line) for line in record.read_text().splitlines()[1:]]
        return next((e["guardian"][0] for e in lines if "guardian" in e), None)

    second = wait_for(new_guardian, "a new guardian in the job's record")
    assert alive(second) and second != first
    assert _run_dirs(tmp_path)  # the workers' private run directory
    proc.kill()  # now the supervisor dies: the new guardian must clean up after it
    proc.wait(timeout=10)
    wait_for(lambda: not [p for p in pids if alive(p)], "the job to be killed", timeout_s=20)
    wait_for(lambda: not _job_files(tmp_path) and not _run_dirs(tmp_path), "the runtime files")
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert f"the guardian (pid {first}) was killed by SIGKILL; started pid {second}" in err


def test_a_run_directory_without_its_record_is_swept(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    (jobs / "dead.run" / "attempt_0").mkdir(parents=True)
    (jobs / "alive.run").mkdir()
    (jobs / "alive.jsonl").write_text("")  # unreadable record: left alone, with its run dir
    records.sweep(jobs)
    assert sorted(p.name for p in jobs.iterdir()) == ["alive.jsonl", "alive.run"]
