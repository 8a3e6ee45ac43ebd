"""The CPU cost of keeping ``xpulaunch top`` open: the view and its sampler, at 1 s refreshes.

    .venv/bin/python bench/bench_top.py [--seconds 30] [--interval 1] [--host fixture|fake|real]

Starts ``xpulaunch top`` in a pseudo-terminal (100x30), lets it start (its imports and first
frames are not what a view kept open costs), then reads the CPU time (user + system, from
/proc/PID/stat) of the view and of its sampler child over ``--seconds``, and prints each as a
percentage of one core. Hosts: ``fixture`` (an inventory file, ``8x-h100.json``: no sampler,
the view reads the queue and draws), ``fake`` (a fake sysfs and /proc of 2 AMD cards with a
DRM client each, from tests/probing/probe_fakes.py: the sampler re-reads them), ``real`` (this
host: NVML kept open in the sampler on an NVIDIA host). Goal: under 2% of one core in all.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "inventories" / "8x-h100.json"
WARM_UP_S = 4.0
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (man 5 proc)


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found += [int(p) for p in handle.read().split()]
    return found


def fake_host(root: Path) -> dict[str, str]:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "probing")]
    from probe_fakes import FakeMachine, mi300x_host
    from test_gpu_processes import AMDGPU_OLD, _process

    machine = FakeMachine(root)
    mi300x_host(machine)
    _process(machine, 4343, {3: AMDGPU_OLD}, {})
    return {"XPULAUNCH_SYSFS_ROOT": str(machine.sys), "XPULAUNCH_PROCFS_ROOT": str(machine.proc)}


def measure(host: str, seconds: float, interval: float, work: Path) -> dict[str, object]:
    env = {**os.environ, "TERM": "xterm-256color", "XPULAUNCH_LOCK_DIR": str(work / "locks")}
    env.pop("XPULAUNCH_INVENTORY", None)
    args = ["top", "--interval", str(interval)]
    if host == "fixture":
        args += ["--inventory", str(FIXTURE)]
    elif host == "fake":
        env.update(fake_host(work / "host"))
    parent, child = pty.openpty()
    import fcntl
    import termios

    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    argv = [sys.executable, "-m", "xpulaunch", *args]
    view = subprocess.Popen(
        argv, stdin=child, stdout=child, stderr=child, env=env, start_new_session=True
    )
    os.close(child)
    drawn = 0
    try:
        deadline = time.monotonic() + WARM_UP_S
        while time.monotonic() < deadline:
            drawn += _drain(parent)
        pids = {"view": view.pid}
        pids.update(("sampler", pid) for pid in children(view.pid))  # none with a fixture
        start = {name: cpu_s(pid) for name, pid in pids.items()}
        start_s = time.monotonic()
        while time.monotonic() - start_s < seconds:
            drawn += _drain(parent)
        wall_s = time.monotonic() - start_s
        used = {name: cpu_s(pid) - start[name] for name, pid in pids.items()}
    finally:
        view.send_signal(signal.SIGINT)  # Ctrl-C quits as q does
        try:
            view.wait(timeout=10)
        except subprocess.TimeoutExpired:
            view.kill()
            view.wait()
        os.close(parent)
    percent = {f"{name}_percent_of_a_core": round(100 * s / wall_s, 2) for name, s in used.items()}
    rate = round(drawn / (wall_s + WARM_UP_S))
    return {
        "host": host,
        "interval_s": interval,
        "seconds": round(wall_s, 1),
        **percent,
        "bytes_drawn_per_s": rate,
    }


def _drain(fd: int) -> int:
    """Read what the view drew (a terminal that is not read from would block it)."""
    import select

    ready, _, _ = select.select([fd], [], [], 0.2)
    if not ready:
        return 0
    try:
        return len(os.read(fd, 65536))
    except OSError:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--host", choices=("fixture", "fake", "real"), action="append")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for host in args.host or ["fixture", "fake"]:
            work = Path(tmp) / host
            work.mkdir()
            print(json.dumps(measure(host, args.seconds, args.interval, work)), flush=True)


if __name__ == "__main__":
    main()
