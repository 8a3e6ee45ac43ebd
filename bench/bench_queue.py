"""The job queue: how soon a job starts, what an idle runner costs, how fast a long queue lists.

    .venv/bin/python bench/bench_queue.py [--rounds N] [--idle S]

Everything runs on the CPU against a fixture inventory of two NVIDIA devices
(``tests/fixtures/inventories/2x-h200.json``), in a fresh lock directory, through the real
commands.

1. Submit to start, a device free: ``xpulaunch submit`` of a job whose program writes the
   time it started; figures: the submit command's own wall time, and from the moment it
   printed the job id to the program's first instruction. Goal: the latter under 0.5 s.
2. Device free to start: job A holds both devices, job B waits queued; from A's program's
   last instruction to B's program's first. Goal: under 0.5 s.
3. The runner's CPU time over ``--idle`` seconds as a share of one core: with nothing to do,
   and while it watches a running job. Goal: under 0.5 %.
4. ``xpulaunch queue`` and ``xpulaunch queue --json`` with 1,000 queued (held) jobs: wall time
   of the command, median of 5. Goal: under 0.2 s.

Timings depend on the machine and its load: compare only figures taken in the same run.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INVENTORY = ROOT / "tests" / "fixtures" / "inventories" / "2x-h200.json"
STAMP = "import sys, time; open(sys.argv[1], 'w').write(repr(time.time()))"
HOLD_THEN_STAMP = (
    "import sys, time; time.sleep(float(sys.argv[2])); "
    "open(sys.argv[1], 'w').write(repr(time.time()))"
)


def xpulaunch(lock_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "xpulaunch", args[0], "--lock-dir", str(lock_dir), *args[1:]]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)


def submit(lock_dir: Path, *args: str) -> int:
    done = xpulaunch(lock_dir, "submit", "--inventory", str(INVENTORY), *args)
    return int(done.stdout)


def read_time(path: Path, timeout_s: float = 60.0) -> float:
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = ""
        if text:
            return float(text)
        time.sleep(0.005)
    raise TimeoutError(f"{path} never written")


def submit_to_start(lock_dir: Path, folder: Path, rounds: int) -> None:
    command_s, start_s = [], []
    for n in range(rounds):
        stamp = folder / f"start-{n}"
        before = time.time()
        submit(lock_dir, "--gpus", "1", "--", sys.executable, "-c", STAMP, str(stamp))
        printed = time.time()
        started = read_time(stamp)
        command_s.append(printed - before)
        start_s.append(started - printed)
        time.sleep(0.3)  # its run ends and the device is free again
    print(f"submit command wall time:       median {statistics.median(command_s):.3f} s")
    print(f"id printed -> program started:  median {statistics.median(start_s):.3f} s, "
          f"max {max(start_s):.3f} s over {rounds} (goal < 0.5 s)")  # fmt: skip


def free_to_start(lock_dir: Path, folder: Path, rounds: int) -> None:
    gaps = []
    for n in range(rounds):
        ended, started = folder / f"a-end-{n}", folder / f"b-start-{n}"
        submit(lock_dir, "--gpus", "2", "--", sys.executable, "-c", HOLD_THEN_STAMP,
               str(ended), "1.0")  # fmt: skip
        submit(lock_dir, "--gpus", "1", "--", sys.executable, "-c", STAMP, str(started))
        gaps.append(read_time(started) - read_time(ended))
        time.sleep(0.3)
    print(f"device free -> next job started: median {statistics.median(gaps):.3f} s, "
          f"max {max(gaps):.3f} s over {rounds} (goal < 0.5 s; includes the first job's "
          "run releasing its lease)")  # fmt: skip


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runner_pid(lock_dir: Path) -> int:
    return int((lock_dir / "queue-runner-0.lock").read_text().split()[0])


def idle_cpu(lock_dir: Path, folder: Path, idle_s: float) -> None:
    pid = runner_pid(lock_dir)
    before, start = cpu_s(pid), time.monotonic()
    time.sleep(idle_s)
    share = (cpu_s(pid) - before) / (time.monotonic() - start) * 100
    print(f"runner CPU, nothing to do:      {share:.3f} % of a core over {idle_s:g} s "
          "(goal < 0.5 %)")  # fmt: skip
    submit(lock_dir, "--gpus", "1", "--", sys.executable, "-c", HOLD_THEN_STAMP,
           str(folder / "long"), str(idle_s + 5))  # fmt: skip
    time.sleep(2.0)  # its run has its lease
    before, start = cpu_s(pid), time.monotonic()
    time.sleep(idle_s)
    share = (cpu_s(pid) - before) / (time.monotonic() - start) * 100
    print(f"runner CPU, one job running:    {share:.3f} % of a core over {idle_s:g} s "
          "(goal < 0.5 %)")  # fmt: skip


def long_queue(lock_dir: Path, jobs: int) -> None:
    from xpulaunch.jobqueue.actions import queue_directory, user_name
    from xpulaunch.jobqueue.policy import JobState
    from xpulaunch.jobqueue.store import Store

    directory = queue_directory(str(lock_dir), os.environ)
    store = Store.open(directory, os.environ, create=True)
    assert store is not None
    with store, store.write():  # the rows submit writes, held so that none starts
        for n in range(jobs):
            store.insert(
                uid=os.getuid(), user=user_name(os.getuid()), state=JobState.HELD,
                command=["python", "train.py", "--seed", str(n)], gpus="1",
                wanted=["nvidia 0 (0000:00:06.0)"], submitted_s=time.time(), job_dir="",
            )  # fmt: skip
    for args in (["queue"], ["queue", "--json"]):
        walls, cpus = [], []
        for _ in range(5):
            used = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            done = xpulaunch(lock_dir, *args)
            walls.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime)
        rows = done.stdout.count('"id"') if "--json" in args else done.stdout.count("\n")
        print(f"xpulaunch {' '.join(args):<13} {jobs} jobs: median "
              f"{statistics.median(walls):.3f} s, min {min(walls):.3f} s, CPU median "
              f"{statistics.median(cpus):.3f} s ({rows} lines; goal < 0.2 s)")  # fmt: skip
    from xpulaunch.jobqueue import listing

    start = time.perf_counter()
    listing.table_rows(listing.take(directory, os.environ))
    print(
        f"listing {jobs} jobs in-process:  {time.perf_counter() - start:.3f} s "
        "(the database and the leases read, the rows made; no interpreter start)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of each CPU window")
    parser.add_argument("--jobs", type=int, default=1000)
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-queue-"))
    lock_dir = folder / "locks"
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f}; lock directory {lock_dir}")  # fmt: skip
    try:
        submit_to_start(lock_dir, folder, options.rounds)
        free_to_start(lock_dir, folder, options.rounds)
        idle_cpu(lock_dir, folder, options.idle)
        xpulaunch(lock_dir, "cancel", "--all")
        long_queue(lock_dir, options.jobs)
    finally:
        try:
            xpulaunch(lock_dir, "cancel", "--all")
        except subprocess.CalledProcessError as exc:
            print(f"cancel: {exc.stderr}", file=sys.stderr)
        pid = (lock_dir / "queue-runner-0.lock").read_text().split()
        if pid:
            subprocess.run(["kill", pid[0]], check=False)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
