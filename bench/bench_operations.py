"""Operating figures: idle supervision with --events and --metrics-port, and an output flood.

    .venv/bin/python bench/bench_operations.py [--quick]

1. ``xpulaunch run`` supervising 256 idle workers (``sleep``), paired in one run: bare, and
   with ``--events FILE --metrics-port P --hang-timeout 600`` while a scraper reads
   ``/metrics`` every 5 s. Figure: the supervisor process's own CPU time over a window, as a
   share of one core. Goal: under 1 % with the options.
2. One worker floods its stdout as fast as it can (aiming at 100,000 lines/s) while another
   prints a line with its send time every 10 ms. Figures: the flood's rate, the steady
   worker's latency (the log file's time stamp of each line minus its send time: how long the
   flood made it wait) and the supervisor's RSS sampled over the run (bounded: it must
   plateau). Goal: the steady worker's lines are not held up and RSS does not grow.

Timings depend on the machine: compare only figures taken in the same run.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import psutil

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")
FLOOD = """
import sys, time
line = b"x" * 60 + b"\\n"
out = sys.stdout.buffer
end = time.monotonic() + float(sys.argv[1])
sent = 0
while time.monotonic() < end:
    out.write(line * 1000)
    sent += 1000
    time.sleep(0.01)  # about 100,000 lines a second where the machine keeps up
out.flush()
print("flooded", sent, flush=True)
"""
STEADY = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    print("tick", repr(time.time()), flush=True)
    time.sleep(0.01)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def started_workers(events: Path) -> int:
    return events.read_text().count('"event":"started"') if events.exists() else 0


def supervisor_cpu_share(extra: list[str], count: int, window_s: float, work: Path) -> float:
    """CPU seconds / wall seconds of the ``xpulaunch`` process alone over ``window_s``."""
    events = work / f"events-{len(extra)}.jsonl"
    port = free_port() if extra else None
    options = [*(o.replace("PORT", str(port)) for o in extra), "--events", str(events)]
    argv = [XPULAUNCH, "run", "--gpus", "none", "--nproc-per-node", str(count), *options,
            "sleep", "1000"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while started_workers(events) < count and time.monotonic() < deadline:
            time.sleep(0.2)
        supervisor = psutil.Process(proc.pid)
        before, began = supervisor.cpu_times(), time.perf_counter()
        while time.perf_counter() - began < window_s:
            if port is not None:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            time.sleep(min(5.0, window_s))
        after, wall = supervisor.cpu_times(), time.perf_counter() - began
        used_s = after.user + after.system - before.user - before.system
        return max(used_s, 0.0) / wall  # never "-0.000 %"
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def bench_idle(work: Path, count: int, window_s: float) -> None:
    with_options = ["--metrics-port", "PORT", "--hang-timeout", "600"]
    bare = supervisor_cpu_share([], count, window_s, work)
    loaded = supervisor_cpu_share(with_options, count, window_s, work)
    print(f"  {count} idle workers, {window_s:.0f} s window: supervisor CPU {100 * bare:.3f}% "
          f"of one core with --events only, {100 * loaded:.3f}% with --events, --metrics-port "
          "(scraped every 5 s) and --hang-timeout")  # fmt: skip


def stamp_s(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def bench_flood(work: Path, seconds: float) -> None:
    (work / "flood.py").write_text(FLOOD)
    (work / "steady.py").write_text(STEADY)
    driver = work / "two.sh"
    driver.write_text(
        '#!/bin/sh\nif [ "$RANK" = 0 ]; then exec "$PY" "$DIR/flood.py" "$SECS"; fi\n'
        'exec "$PY" "$DIR/steady.py" "$SECS"\n'
    )
    driver.chmod(0o755)
    logs = work / "flood-logs"
    env = {**os.environ, "PY": sys.executable, "DIR": str(work), "SECS": str(seconds)}
    argv = [XPULAUNCH, "run", "--gpus", "none", "--nproc-per-node", "2", "--log-dir", str(logs),
            str(driver)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    supervisor = psutil.Process(proc.pid)
    rss: list[int] = []
    while proc.poll() is None:
        try:
            rss.append(supervisor.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.25)
    flood_log = (logs / "attempt_0" / "0.log").read_text().splitlines()
    flooded = int(flood_log[-1].split()[-1]) if flood_log[-1].endswith(tuple("0123456789")) else 0
    lags = [stamp_s(line.split()[0]) - float(line.split()[2])
            for line in (logs / "attempt_0" / "1.log").read_text().splitlines()]  # fmt: skip
    mib = [r / 2**20 for r in rss]
    half = len(mib) // 2
    print(f"  flood: {flooded / seconds:,.0f} lines/s for {seconds:.0f} s "
          f"({len(flood_log) - 1:,} lines in its log)")  # fmt: skip
    print(f"  steady worker: {len(lags)} lines, latency median {1e3 * statistics.median(lags):.1f}"
          f" ms, max {1e3 * max(lags):.1f} ms")  # fmt: skip
    print(f"  supervisor RSS: first half max {max(mib[:half] or [0]):.1f} MiB, second half max "
          f"{max(mib[half:] or [0]):.1f} MiB")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="shorter windows")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        print("idle supervision:")
        bench_idle(Path(tmp), 256, 5.0 if args.quick else 15.0)
        print("output flood:")
        bench_flood(Path(tmp), 4.0 if args.quick else 10.0)


if __name__ == "__main__":
    main()
