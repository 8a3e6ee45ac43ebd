"""SIGUSR1 and SIGUSR2 sent to xpulaunch reach every worker, and the job goes on (Slurm's
``--signal`` before a preemption: the workers checkpoint, the job is not stopped)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import wait_for
from run_kit import XPULAUNCH, read_events

WORKER = """
import os, signal, sys, time
from pathlib import Path
got = []
def handle(signum, frame):
    got.append(signum)
    Path(sys.argv[1], signal.Signals(signum).name + "-" + os.environ["LOCAL_RANK"]).touch()
for name in ("SIGUSR1", "SIGUSR2"):
    signal.signal(getattr(signal, name), handle)
Path(sys.argv[1], "ready-" + os.environ["LOCAL_RANK"]).touch()
for _ in range(1200):
    if len(got) == 2:
        break
    time.sleep(0.05)
print("handled " + ",".join(signal.Signals(s).name for s in got), flush=True)
"""


def ready(folder: Path, count: int) -> Callable[[], bool]:
    return lambda: len(list(folder.glob("ready-*"))) == count


def relay_twice(proc: subprocess.Popen[str], folder: Path, count: int) -> tuple[str, str]:
    wait_for(ready(folder, count), "every worker's handlers", timeout_s=60)
    proc.send_signal(signal.SIGUSR1)
    # One at a time: two signals sent back to back may be handled in either order (Python
    # runs the second one's handler inside the first's when it lands meanwhile), in
    # xpulaunch as in a worker; the order relayed is what is checked.
    wait_for(lambda: len(list(folder.glob("SIGUSR1-*"))) == count, "SIGUSR1 to be relayed")
    proc.send_signal(signal.SIGUSR2)
    return proc.communicate(timeout=60)


def test_usr1_and_usr2_reach_every_worker_and_the_job_goes_on(
    start: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    events = tmp_path / "events.jsonl"
    proc = start("--nproc-per-node", "2", "--events", str(events), str(worker), str(tmp_path))
    out, err = relay_twice(proc, tmp_path, 2)
    assert proc.returncode == 0, err
    assert sorted(out.splitlines()) == ["[0] handled SIGUSR1,SIGUSR2",
                                        "[1] handled SIGUSR1,SIGUSR2"]  # fmt: skip
    assert "SIGUSR1: sent on to the workers (0, 1); the job goes on" in err
    forwarded = [e for e in read_events(events) if e["event"] == "signal_forwarded"]
    assert [(e["signal"], e["names"]) for e in forwarded] == [
        ("SIGUSR1", ["0", "1"]), ("SIGUSR2", ["0", "1"]),
    ]  # fmt: skip
    assert [e["exit_code"] for e in read_events(events) if e["event"] == "stopped"] == [0]


@pytest.mark.parametrize("listed", ["SIGTERM,SIGUSR1,SIGUSR2", "SIGUSR1"])
def test_torchrun_signals_to_handle_lists_them(tmp_path: Path, listed: str) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    proc = subprocess.Popen(
        [XPULAUNCH, "torchrun", "--gpus", "none", "--nproc-per-node", "1",
         "--signals-to-handle", listed, str(worker), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = relay_twice(proc, tmp_path, 1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "[0] handled SIGUSR1,SIGUSR2" in out
