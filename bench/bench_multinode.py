"""Time to the first training step of a 2-node x 2-worker CPU job on loopback, paired in one run.

    .venv/bin/python bench/bench_multinode.py [--runs 3] [--only bare,xpulaunch-static]

Five ways of starting the same four gloo workers of ``examples/train.py``, interleaved round by
round: both nodes under xpulaunch with the static rendezvous (``--nnodes 2 --node-rank R``) and
with c10d (``--rdzv-backend c10d``), both under torchrun with the same two rendezvous, and the
four workers started bare with the rank variables set by hand.
The clock runs from the start of the first process to rank 0's "step 1" line. The
launcher's share is a way's median minus the bare median; goals: static at most 1/10 of
torchrun's static share, c10d at most torchrun's c10d share. Compare only figures of one run
(the workers' four torch imports dominate).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from bench_supervisor import bench_env  # the same directory: run as bench/bench_multinode.py

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "examples" / "train.py")
TRAIN_ARGS = ["--steps", "3", "--dist-backend", "gloo"]
NPROC = 2
QUIET = not os.environ.get("BENCH_VERBOSE")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def xpulaunch_command() -> list[str]:
    """The ``xpulaunch`` console script next to this Python, as users run it (and as torchrun
    is run below); ``python -m xpulaunch`` where the checkout is not installed."""
    script = shutil.which("xpulaunch", path=str(Path(sys.executable).parent))
    return [script] if script is not None else [sys.executable, "-m", "xpulaunch"]


def xpulaunch_nodes(rdzv: str, port: int, ckpt: Path) -> list[list[str]]:
    base = [*xpulaunch_command(), "--gpus", "none", "--nproc-per-node", str(NPROC)]
    if rdzv == "static":
        nodes = [[*base, "--nnodes", "2", "--node-rank", str(r), "--master-port", str(port)]
                 for r in range(2)]  # fmt: skip
    else:
        nodes = [[*base, "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                  f"127.0.0.1:{port}", "--rdzv-id", "bench"] for _ in range(2)]  # fmt: skip
    return [[*node, TRAIN, "--ckpt-dir", str(ckpt), *TRAIN_ARGS] for node in nodes]


def torchrun_nodes(rdzv: str, port: int, ckpt: Path) -> list[list[str]]:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        raise SystemExit("torchrun is not installed next to this Python")
    base = [torchrun, "--nnodes", "2", "--nproc-per-node", str(NPROC)]
    if rdzv == "static":
        nodes = [[*base, "--node-rank", str(r), "--master-addr", "127.0.0.1", "--master-port",
                  str(port)] for r in range(2)]  # fmt: skip
    else:
        nodes = [[*base, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                  "--rdzv-id", "bench"] for _ in range(2)]  # fmt: skip
    return [[*node, TRAIN, "--ckpt-dir", str(ckpt), *TRAIN_ARGS] for node in nodes]


def bare_workers(port: int, ckpt: Path) -> list[tuple[list[str], dict[str, str]]]:
    """The four workers with torchrun's variables written by hand."""
    workers = []
    for rank in range(2 * NPROC):
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank % NPROC), "WORLD_SIZE": "4",
               "LOCAL_WORLD_SIZE": str(NPROC), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
        workers.append(([sys.executable, TRAIN, "--ckpt-dir", str(ckpt), *TRAIN_ARGS], env))
    return workers


def processes(way: str, ckpt: Path) -> list[tuple[list[str], dict[str, str]]]:
    port = free_port()
    if way == "bare":
        return bare_workers(port, ckpt)
    launcher, rdzv = way.split("-")
    make = xpulaunch_nodes if launcher == "xpulaunch" else torchrun_nodes
    return [(argv, {}) for argv in make(rdzv, port, ckpt)]


def time_to_first_step(way: str, env: dict[str, str], ckpt: Path) -> dict[str, float] | None:
    """Seconds from the first start to: the first and the last worker past its imports (its
    "rank R/W" line, printed before ``init_process_group``) and rank 0's "step 1" line. With
    c10d the rendezvous decides which node holds global rank 0, so every process's output is
    watched."""
    start = time.perf_counter()
    started = [
        subprocess.Popen(argv, env={**env, **extra}, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL if QUIET else None, text=True)
        for argv, extra in processes(way, ckpt)
    ]  # fmt: skip
    ranks: list[float] = []
    steps: list[float] = []
    lock = threading.Lock()

    def watch(stream: IO[str]) -> None:
        for line in stream:  # read to the end, so that no process blocks on a full pipe
            now = time.perf_counter() - start
            with lock:  # counted, not matched: unbuffered workers' lines can share a line
                ranks.extend([now] * line.count(" local_rank "))
                steps.extend([now] * line.count("step 1 loss"))

    readers = [threading.Thread(target=watch, args=(p.stdout,)) for p in started]
    for reader in readers:
        reader.start()
    for process in started:
        process.wait(timeout=300)
    for reader in readers:
        reader.join()
    failed = [p.returncode for p in started if p.returncode != 0]
    if failed or not steps or len(ranks) != 2 * NPROC:
        print(f"  {way}: round left out: exit statuses {failed}, {len(ranks)} workers said "
              f"their rank, {len(steps)} a step", flush=True)  # fmt: skip
        return None
    return {"first": min(ranks), "last": max(ranks), "step": min(steps)}


WAYS = (
    "bare",
    "xpulaunch-static",
    "torchrun-static",
    "xpulaunch-c10d",
    "torchrun-c10d",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default=",".join(WAYS), help="ways to run, comma-separated")
    args = parser.parse_args()
    ways = [w for w in WAYS if w in args.only.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # Every way on the CPU, torchrun's too: on a GPU host its workers would otherwise pick
        # the GPU (examples/train.py follows what it sees) and pay CUDA's start.
        env = {**bench_env(work), "NO_COLOR": "1", "CUDA_VISIBLE_DEVICES": ""}
        times: dict[str, list[float]] = {w: [] for w in ways}
        phases: dict[str, list[dict[str, float]]] = {w: [] for w in ways}
        for i in range(args.runs + 1):  # round 0 warms caches and bytecode
            for way in ways:
                took = time_to_first_step(way, env, work / f"ckpt-{way}-{i}")
                if i and took is not None:
                    times[way].append(took["step"])
                    phases[way].append(took)
                    print(f"  round {i} {way}: first worker past its imports "
                          f"{took['first']:.2f} s, last {took['last']:.2f} s, "
                          f"step 1 {took['step']:.2f} s", flush=True)  # fmt: skip
    report(times, args.runs)
    print("phases, medians (the workers' rendezvous and DDP set-up lie between last and step):")
    for way, values in phases.items():
        first, last = (statistics.median(v[k] for v in values) for k in ("first", "last"))
        print(
            f"  {way:17} first worker past imports {first:5.2f} s, last {last:5.2f} s, "
            f"last to step 1 {statistics.median(v['step'] - v['last'] for v in values):5.2f} s"
        )


def report(times: dict[str, list[float]], runs: int) -> None:
    medians = {way: statistics.median(values) for way, values in times.items()}
    bare = medians.get("bare")
    print(f"time to first step, median of {runs} (cpu count {os.cpu_count()}):")
    for way, median in medians.items():
        share = "" if bare is None or way == "bare" else f"  launcher share {median - bare:+.2f} s"
        spread = f"({min(times[way]):.2f}-{max(times[way]):.2f})"
        print(f"  {way:17} {median:6.2f} s {spread:13}{share}")
    for rdzv in ("static", "c10d"):
        ours = medians.get(f"xpulaunch-{rdzv}")
        theirs = medians.get(f"torchrun-{rdzv}")
        if bare is not None and ours is not None and theirs is not None and theirs > bare:
            print(
                f"  {rdzv}: xpulaunch's share / torchrun's = {(ours - bare) / (theirs - bare):.2f}"
            )


if __name__ == "__main__":
    main()
