"""Supervisor figures, paired in one run: overhead vs bare and torchrun, RSS, restart latency,
stopping 64 workers with grandchildren, CPU while supervising 256 idle workers.

    .venv/bin/python bench/bench_supervisor.py [--quick]

Goals (issue 4): overhead <= 60 ms over bare, supervisor + guardian RSS < 30 MiB, restart
within 15 ms of the exit with backoff 0, stop 64 workers (with grandchildren) < 0.5 s, and
< 1% of one core while 256 workers idle. Timings depend on the machine: compare only figures
taken in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_probe import CONSOLE_SCRIPT  # the same directory: run as bench/bench_supervisor.py

from xpulaunch.events import Event, Exited, Started
from xpulaunch.joblog.logs import LogConfig
from xpulaunch.processes.procfs import find_job
from xpulaunch.supervisor.restart import RestartMode, RestartPolicy
from xpulaunch.supervisor.supervisor import Supervisor, WorkerSpec

QUIET = LogConfig(console=False)
DRIVER = """
import sys
from xpulaunch import run
sys.exit(run(sys.argv[1:], gpus="none"))
"""


def timed_once(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one run of ``argv``."""
    start = time.perf_counter()
    done = subprocess.run(argv, check=False, env=env, capture_output=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"{argv} failed: {done.stderr.decode()[-500:]}")
    return time.perf_counter() - start


def timed_rounds(
    commands: dict[str, list[str]], env: dict[str, str], runs: int
) -> dict[str, list[float]]:
    """``runs`` rounds, each running every command once, interleaved so that a busy minute of
    a shared machine slows all of them alike; one warm-up round first (bytecode, caches)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for i in range(runs + 1):
        for name, argv in list(commands.items()):
            try:
                took = timed_once(argv, env)
            except SystemExit as exc:
                print(f"  {name}: not measured ({str(exc).splitlines()[-1][:120]})")
                del commands[name], times[name]
                continue
            if i:
                times[name].append(took)
    return times


def launchers(work: Path, script: str = "pass\n") -> dict[str, list[str]]:
    """Ways to start one worker running ``script``: bare, through ``xpulaunch.run()``, through the
    ``xpulaunch`` command (the console script, as users run it) with an empty inventory (no
    probing) and with the default ``--gpus auto`` (probing this host), and through torchrun."""
    worker = work / "worker.py"
    worker.write_text(script)
    inventory = work / "empty.json"
    inventory.write_text(json.dumps({"schema": "xpulaunch.inventory/1", "devices": []}))
    driver = work / "driver.py"
    driver.write_text(DRIVER)
    py = sys.executable
    bindir = str(Path(py).parent)
    script_path = shutil.which("xpulaunch", path=bindir)
    if script_path is None:  # a checkout on PYTHONPATH (the lent GPU machines): pip's script
        (work / "bin").mkdir(exist_ok=True)  # not work/xpulaunch: that is the lock directory
        script_path = str(work / "bin" / "xpulaunch")
        Path(script_path).write_text(CONSOLE_SCRIPT)
        command = [py, script_path]
    else:
        command = [script_path]
    found = {
        "bare": [py, str(worker)],
        "library": [py, str(driver), py, str(worker)],
        "xpulaunch": [*command, "--gpus", "none", "--inventory", str(inventory), str(worker)],
        "probing": [*command, str(worker)],
    }
    torchrun = shutil.which("torchrun", path=bindir)
    if torchrun:
        found["torchrun"] = [torchrun, "--standalone", "--nproc-per-node=1", str(worker)]
    return found


def bench_env(work: Path) -> dict[str, str]:
    """Like an installed package: bytecode cached (in ``work``, never in the checkout)."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(work), "PYTHONPYCACHEPREFIX": str(work / "pyc")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def bench_overhead(work: Path, runs: int) -> dict[str, float]:
    env = bench_env(work)
    times = timed_rounds(launchers(work), env, runs)
    medians = {name: statistics.median(values) for name, values in times.items()}
    bare = medians["bare"]
    print(f"  bare python worker: {bare * 1e3:7.1f} ms (median of {runs})")
    for name in ("library", "xpulaunch", "probing", "torchrun"):
        if name in medians:
            extra_ms = (medians[name] - bare) * 1e3
            print(f"  {name:>9}: {medians[name] * 1e3:7.1f} ms, overhead {extra_ms:7.1f} ms")
    if "torchrun" in medians:
        ours = medians.get("xpulaunch", medians.get("library", bare))
        print(f"  torchrun overhead / ours: {(medians['torchrun'] - bare) / (ours - bare):.1f}x")
    return medians


def proc_kib(pid: int, key: str, file: str = "status") -> int:
    """``VmHWM`` (peak RSS) from status, or ``Pss`` from smaps_rollup, in KiB."""
    for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def bench_rss(work: Path) -> None:
    env = bench_env(work)
    for name, argv in launchers(work, "import time; time.sleep(3)\n").items():
        if name not in ("library", "xpulaunch", "probing"):
            continue
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.5)
        if proc.poll() is not None:
            print(f"  {name}: not measured ({proc.stderr.read().decode()[-120:]!r})")
            continue
        guardian = [c for c in _children(proc.pid) if "guardian.py" in _cmdline(c)]
        both = [proc.pid, *guardian]
        sup_kib, guard_kib = (proc_kib(p, "VmHWM") for p in (proc.pid, *guardian[:1]))
        # PSS splits the pages both share (the same python binary and libraries).
        pss_kib = sum(proc_kib(p, "Pss", "smaps_rollup") for p in both)
        proc.wait(timeout=30)
        total = (sup_kib + guard_kib) / 1024
        print(f"  {name}: peak RSS supervisor {sup_kib / 1024:.1f} MiB + guardian "
              f"{guard_kib / 1024:.1f} MiB = {total:.1f} MiB; PSS of both "
              f"{pss_kib / 1024:.1f} MiB")  # fmt: skip


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def supervise(workers: list[WorkerSpec], policy: RestartPolicy, work: Path, **kw: object):
    events: list[Event] = []
    sup = Supervisor(workers, policy, logs=QUIET, on_event=events.append, record_dir=work,
                     **kw)  # type: ignore[arg-type]  # fmt: skip
    return sup, events


def bench_restart(work: Path, restarts: int) -> None:
    # The worker prints the wall time right before _exit: latency = next Started - that.
    code = "import os, time; os.write(1, b'%r\\n' % time.time()); os._exit(1)"
    worker = WorkerSpec("0", [sys.executable, "-S", "-c", code], dict(os.environ))
    policy = RestartPolicy(max_restarts=restarts, backoff_initial_s=0.0)
    sup, events = supervise([worker], policy, work, clock=time.time)
    sup.start()
    sup.wait(120)
    exits = [float(line) for line in sup.tail("0", restarts + 1)]
    starts = [e.time_s for e in events if isinstance(e, Started)][1:]
    seen = [e.time_s for e in events if isinstance(e, Exited)]
    latency = [(s - x) * 1e3 for s, x in zip(starts, exits, strict=False)]
    notice = [(n - x) * 1e3 for n, x in zip(seen, exits, strict=False)]
    print(f"  {len(latency)} restarts, backoff 0: exit -> next start median "
          f"{statistics.median(latency):.1f} ms, p90 {_p90(latency):.1f} ms; "
          f"exit noticed after median {statistics.median(notice):.2f} ms")  # fmt: skip


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.05)


def bench_stop(work: Path, count: int) -> None:
    # Each worker: a shell with one child in its group and one that left it with setsid.
    script = "sleep 1000 & setsid sleep 1000 & wait"
    workers = [WorkerSpec(str(i), ["sh", "-c", script], dict(os.environ)) for i in range(count)]
    sup, _ = supervise(workers, RestartPolicy(mode=RestartMode.NO), work, grace_s=5.0)
    sup.start()
    wait_until(lambda: len(find_job(sup.job_id, {})) >= 3 * count, 60)
    start = time.perf_counter()
    sup.stop()
    elapsed = time.perf_counter() - start
    left = len(find_job(sup.job_id, {}))
    print(f"  stop {count} workers ({3 * count} processes): {elapsed * 1e3:.0f} ms, left: {left}")


def bench_idle_cpu(work: Path, count: int, window_s: float) -> None:
    workers = [WorkerSpec(str(i), ["sleep", "1000"], dict(os.environ)) for i in range(count)]
    sup, _ = supervise(workers, RestartPolicy(mode=RestartMode.NO), work)
    sup.start()
    time.sleep(1.0)  # let every worker start
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(window_s)
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    sup.stop()
    print(f"  {count} idle workers for {wall:.1f} s: supervisor CPU {cpu * 1e3:.1f} ms "
          f"= {100 * cpu / wall:.3f}% of one core")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer runs, shorter windows")
    args = parser.parse_args()
    runs = 5 if args.quick else 15
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("overhead (trivial worker, wall time of the whole command):")
        bench_overhead(work, runs)
        print("memory:")
        bench_rss(work)
        print("restart latency:")
        bench_restart(work, 10 if args.quick else 30)
        print("stopping:")
        bench_stop(work, 64)
        print("idle supervision:")
        bench_idle_cpu(work, 256, 5.0 if args.quick else 10.0)


if __name__ == "__main__":
    main()
