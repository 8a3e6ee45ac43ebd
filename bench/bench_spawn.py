"""What starting one worker and the guardian costs the supervisor, each way, in the same run.

    .venv/bin/python bench/bench_spawn.py [--runs N]

1. ``spawn()`` of ``/bin/true`` with the parent-death signal set by util-linux ``setpriv``
   (CPython can vfork: no Python runs in the child) against the ``preexec_fn`` way (fork, then
   prctl through ctypes in the child). Timed: how long the supervisor is blocked in
   ``spawn()``, and the whole start-to-exit of the worker. Run after importing what
   ``xpulaunch run`` imports, so that the process forked is the supervisor's size.
2. The guardian: the ``/bin/sh`` first stage that waits on the pipe against starting the
   Python guardian directly, each told ``done`` at once: wall time and peak RSS.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from xpulaunch.processes import (
    guardian,
    spawn,
)


def _blocked_and_total(setpriv: bool, runs: int) -> tuple[float, float]:
    lookup = spawn._setpriv
    if not setpriv:
        spawn._setpriv = lambda: None  # type: ignore[assignment]
    blocked, total = [], []
    try:
        for _ in range(runs):
            start = time.perf_counter()
            proc = spawn.spawn(["/bin/true"], dict(os.environ))
            blocked.append(time.perf_counter() - start)
            proc.wait()
            total.append(time.perf_counter() - start)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
    finally:
        spawn._setpriv = lookup  # type: ignore[method-assign]
    return statistics.median(blocked) * 1e3, statistics.median(total) * 1e3


def _guardian(stage: str, runs: int) -> tuple[float, float]:
    """Median wall time from start to exit when told ``done`` at once, and the peak RSS
    (VmHWM) of one that waited 0.3 s first. Not wait4's ru_maxrss: exec keeps in it the
    peak of the address space it replaced, here the supervisor's."""
    argv = guardian.command(sys.executable, "bench", 0, "/nonexistent/record")
    if stage == "python":
        argv = [sys.executable, "-S", "-E", "-s", guardian.__file__, "bench", "0", "/nonexistent"]
    walls, peak_mib = [], 0.0
    for i in range(runs + 1):
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, env={}, start_new_session=True)
        assert proc.stdin is not None
        if i == runs:  # the last one: let it start, then read its peak
            time.sleep(0.3)
            peak_mib = _vm_hwm_kib(proc.pid) / 1024
        proc.stdin.write(b"done\n")
        proc.stdin.close()
        assert proc.wait() == 0
        if i < runs:
            walls.append(time.perf_counter() - start)
    return statistics.median(walls) * 1e3, peak_mib


def _vm_hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    runs = parser.parse_args().runs
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f}, supervisor RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")  # fmt: skip
    if spawn._setpriv() is None:
        print("no util-linux setpriv with --pdeathsig here: only the preexec_fn way exists")
        return
    rounds: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(5):  # interleaved, so that a busy moment slows both ways alike
        for way, taken in rounds.items():
            taken.append(_blocked_and_total(way, runs // 5))
    print("spawn() of /bin/true, median per round, median of 5 rounds:")
    for way, name in ((True, "setpriv"), (False, "preexec_fn + prctl")):
        blocked = statistics.median(r[0] for r in rounds[way])
        total = statistics.median(r[1] for r in rounds[way])
        print(f"  {name:>18}: supervisor blocked {blocked:5.2f} ms, start to exit {total:5.2f} ms")
    print("guardian told 'done' at once (wall time, peak RSS), median:")
    for stage in ("shell", "python"):
        wall, peak = _guardian(stage, max(runs // 10, 5))
        print(f"  {stage:>18}: {wall:5.1f} ms, {peak:4.1f} MiB")


if __name__ == "__main__":
    main()
