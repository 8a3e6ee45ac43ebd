"""The workload the ``xpulaunch run`` lease tests launch (as PROGRAM, through the real CLI).

    cli_job.py audit AUDIT TAG SECONDS [PID:TICKS ...]
        Hold the device for SECONDS, then append one JSON line to AUDIT: the unit key this job
        got (``XPULAUNCH_DEVICES``), its ``CUDA_VISIBLE_DEVICES``, its start and end on
        CLOCK_MONOTONIC (one clock for every process of the host), TAG, its uid and queue job
        (``XPULAUNCH_QUEUE_JOB``), and which of the given processes (pid and /proc start
        ticks) were still alive when it started.
    cli_job.py hold INFO [--grandchild]
        Start a grandchild in its own session (as a daemon or a DataLoader pool would), write
        INFO (JSON: our pid, the grandchild's), then sleep until INFO + ".release" appears.

Only the standard library: it starts fast, and it is what a user's script would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping

POLL_S = 0.05
HOLD_LIMIT_S = 120.0  # never outlive a broken test for long


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks (/proc/PID/stat field 22); None when gone.

    A zombie counts as gone: it holds no files and no device any more.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def _alive(identities: list[str]) -> list[int]:
    """The pids among ``PID:TICKS`` that still run as the same process (not a reused pid)."""
    alive = []
    for identity in identities:
        pid, ticks = (int(part) for part in identity.split(":"))
        if start_ticks(pid) == ticks:
            alive.append(pid)
    return alive


def _append(path: str, record: Mapping[str, object]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())  # one O_APPEND write: no interleaving
    finally:
        os.close(fd)


def audit(path: str, tag: str, seconds: float, identities: list[str]) -> None:
    start_s = time.monotonic()
    alive = _alive(identities)  # right at the start: the old job must be gone by now
    time.sleep(seconds)
    record = {
        "tag": tag,
        "device": os.environ.get("XPULAUNCH_DEVICES"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "start_s": start_s,
        "end_s": time.monotonic(),
        "pid": os.getpid(),
        "uid": os.getuid(),
        "queue_job": os.environ.get("XPULAUNCH_QUEUE_JOB"),
        "old_alive": alive,
    }
    _append(path, record)


def hold(info: str, grandchild: bool) -> None:
    child = None
    if grandchild:
        sleeper = f"import time; time.sleep({HOLD_LIMIT_S})"
        # Its own session and no lease descriptor (close_fds): only the guardian, which
        # finds it by the XPULAUNCH_JOB_ID marker, stands between it and an orphan.
        child = subprocess.Popen([sys.executable, "-c", sleeper], start_new_session=True)
    record = {
        "pid": os.getpid(),
        "grandchild": child.pid if child else None,
        "device": os.environ.get("XPULAUNCH_DEVICES"),
        "job_id": os.environ.get("XPULAUNCH_JOB_ID"),
    }
    with open(info + ".tmp", "w") as handle:
        json.dump(record, handle)
    os.rename(info + ".tmp", info)  # readers never see half a file
    deadline_s = time.monotonic() + HOLD_LIMIT_S
    while not os.path.exists(info + ".release") and time.monotonic() < deadline_s:
        time.sleep(POLL_S)
    if child is not None:
        child.kill()
        child.wait()


def main(argv: list[str]) -> int:
    if argv[0] == "audit":
        audit(argv[1], argv[2], float(argv[3]), argv[4:])
    elif argv[0] == "hold":
        hold(argv[1], grandchild="--grandchild" in argv[2:])
    else:
        print(f"cli_job.py: unknown action {argv[0]!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
