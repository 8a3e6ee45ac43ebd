"""What a long crash loop leaves: nothing piles up in the guardian's pipe or the run
directories, and a stopped guardian never freezes the supervisor."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import sys
import termios
import time
from pathlib import Path

from fault_cli import Launch, finish
from helpers import wait_for

# A worker that fails with an error file (torch's @record) and, with --heartbeat, beats.
FAILING = """
import json, os, sys
import xpulaunch
xpulaunch.heartbeat()
with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
    json.dump({"message": {"message": "ValueError: boom", "extraInfo": {}}}, f)
sys.exit(3)
"""

# ... the same, reporting how many attempt directories its run directory holds.
COUNTING = """
import os, sys
run_dir = os.path.dirname(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"]))
print("attempts", len([n for n in os.listdir(run_dir) if n.startswith("attempt_")]))
open(os.environ["TORCHELASTIC_ERROR_FILE"], "w").write("{}")
sys.exit(3)
"""


def _record(runtime: Path) -> dict[str, object]:
    [record] = (runtime / "xpulaunch" / "jobs").glob("*.jsonl")
    head: dict[str, object] = json.loads(record.read_text().splitlines()[0])
    return head


def _pipe_bytes(pid: int) -> int:
    """Bytes waiting in the pipe that is ``pid``'s stdin."""
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
    try:
        buf = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
        return int(struct.unpack("i", buf)[0])
    finally:
        os.close(fd)


def test_a_stopped_guardian_gets_nothing_and_freezes_nothing(
    launch: Launch, tmp_path: Path
) -> None:
    proc = launch("run", "--restart", "always", "--backoff", "0", "--grace", "2",
                  "--nproc-per-node", "4", "--isolate", "sh", "-c", "exit 1")  # fmt: skip
    jobs = tmp_path / "xpulaunch" / "jobs"
    head = wait_for(lambda: list(jobs.glob("*.jsonl")) and _record(tmp_path), "the job's record")
    guardian = head["guardian"][0]  # type: ignore[index]
    os.kill(guardian, signal.SIGSTOP)
    try:
        time.sleep(2)  # hundreds of restarts
        # Every spawn used to add a line to the pipe (and, full, block the loop for good).
        assert _pipe_bytes(guardian) == 0
        started = time.monotonic()
        proc.terminate()
        code, _, err = finish(proc, timeout_s=20)
        assert code == 128 + signal.SIGTERM, err
        assert time.monotonic() - started < 8
    finally:
        os.kill(guardian, signal.SIGCONT)


def test_a_crash_loop_with_error_files_and_heartbeats_keeps_twenty_attempts(
    launch: Launch, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    args = ("--log-dir", str(logs), "--max-restarts", "30", "--backoff", "0",
            "--hang-timeout", "30", "--heartbeat")  # fmt: skip
    code, _, err = finish(launch("run", *args, sys.executable, "-c", FAILING), timeout_s=120)
    assert code == 3, err
    kept = sorted(int(p.name.split("_")[1]) for p in logs.glob("attempt_*"))
    assert kept == [0, *range(11, 31)]  # it used to keep all 31: error files and heartbeats


def test_the_private_run_directory_keeps_twenty_attempts(launch: Launch) -> None:
    args = ("--max-restarts", "30", "--backoff", "0")
    code, out, err = finish(launch("run", *args, sys.executable, "-c", COUNTING), timeout_s=120)
    assert code == 3, err
    counts = [int(line.split()[-1]) for line in out.splitlines() if "attempts" in line]
    assert len(counts) == 31
    assert max(counts) == 21  # attempt_0 and the last 20; it used to grow to 31
