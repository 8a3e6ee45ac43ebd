"""Leases across real processes: SIGKILLed launchers, inherited descriptors, racing launches.

The 32-job contention test runs the real ``xpulaunch run`` (test_cli_leases.py).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import wait_for
from xpulaunch.leases import LeaseManager

Processes = Any  # the processes fixture (tests/leases/conftest.py)
KEY = "0000:01:00.0"


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts: it holds no files any more)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_sigkilled_launcher_keeps_the_lease_until_its_child_exits(
    lock_dir: Path, processes: Processes
) -> None:
    holder = processes.worker(lock_dir, "--devices", "1", "--gpus", f"device={KEY}", "spawn")
    assert holder.stdout is not None
    assert holder.stdout.readline().startswith(f"acquired {KEY} ")
    info = json.loads(holder.stdout.readline())  # the child runs; the holder dropped its fds
    child = info["child"]
    processes.orphans.append(child)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()

    # Straight away, the device is still leased: by the orphaned child's inherited fd.
    busy = processes.worker(lock_dir, "--devices", "1", "--gpus", f"device={KEY}", "hold")
    _out, err = busy.communicate(timeout=20)
    assert busy.returncode == 1
    # Named as gone: its pid is no process to stop (or another's by now).
    assert f"{KEY} is leased by pid {holder.pid}, which has exited (lease_worker spawn" in err
    [record] = LeaseManager(lock_dir).status().leases
    assert record.key == KEY and record.holder is not None
    assert record.holder.pid == holder.pid and record.holder_alive is False

    waiter = processes.worker(lock_dir, "--devices", "1", "--gpus", "1", "--wait", "hold")
    wait_for(lambda: len(LeaseManager(lock_dir).status().waiting) == 1)
    time.sleep(0.5)  # several of its polls: it must still be waiting
    assert waiter.poll() is None

    killed_at = time.monotonic()
    os.kill(child, signal.SIGKILL)
    out, err = waiter.communicate(timeout=20)
    assert waiter.returncode == 0, err
    acquired_at = float(out.split()[2])
    assert _gone(child)
    assert killed_at < acquired_at < killed_at + 2.0  # right after, not before


@pytest.mark.slow
def test_racing_launches_never_pick_the_same_device(
    lock_dir: Path, processes: Processes, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.txt"
    # No --wait: each gets one try. A slow planner (0.1 s) makes the launches overlap in the
    # read-plan-lock step; only the allocation lock keeps them from all choosing device 1.
    jobs = [
        processes.worker(
            lock_dir,
            "--devices",
            "6",
            "--gpus",
            "1",
            "--plan-delay",
            "0.1",
            "hold",
            "--seconds",
            "1.5",
            "--audit",
            str(audit),
        )
        for _ in range(6)
    ]
    for job in jobs:
        _out, err = job.communicate(timeout=30)
        assert job.returncode == 0, err
    keys = [line.split()[0] for line in audit.read_text().splitlines()]
    assert sorted(keys) == [f"0000:0{i}:00.0" for i in range(1, 7)]
