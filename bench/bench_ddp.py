"""Wall time of a whole DDP run of ``examples/train.py`` on N GPUs: bare, xpulaunch, torchrun.

    python3 bench/bench_ddp.py --gpus 2 [--runs 3] [--steps 1000] [--src DIR]

Each round runs the same N-rank NCCL job three ways, interleaved, each with a fresh
checkpoint folder: ``bare``, N processes started at once with torchrun's variables written
by hand and ``CUDA_VISIBLE_DEVICES`` naming GPUs 0..N-1; ``xpulaunch examples/train.py --gpus
N --nproc-per-node auto`` (the console script, importing xpulaunch from ``--src``); and
``torchrun --standalone --nproc-per-node N`` (``python -m torch.distributed.run``) with the
same mask. Prints each way's median, its ratio to bare's median, and the median of the
per-round ratios (paired, so a slow minute of the machine counts against every way alike).
Goal: xpulaunch within 3% of bare.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_compare import script_for  # the same directory: run as bench/bench_ddp.py
from bench_supervisor import bench_env

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "examples" / "train.py")


def ways(gpus: int, steps: int, src: Path, work: Path) -> dict[str, list[list[str]]]:
    """Each way as the processes it starts at once."""
    py = sys.executable
    (work / "bin").mkdir(exist_ok=True)
    script = str(script_for(src, work / "bin"))
    args = ["--steps", str(steps)]
    return {
        "bare": [[py, TRAIN, *args] for _ in range(gpus)],
        "xpulaunch": [[py, script, TRAIN, "--gpus", str(gpus), "--nproc-per-node", "auto",
                       *args]],
        "torchrun": [[py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                      str(gpus), TRAIN, *args]],
    }  # fmt: skip


def bare_env(env: dict[str, str], rank: int, gpus: int, port: int) -> dict[str, str]:
    return {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(gpus),
            "LOCAL_WORLD_SIZE": str(gpus), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1"}  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def timed(way: str, commands: list[list[str]], env: dict[str, str], ckpt: Path) -> float:
    """Wall seconds from the first start until every process has ended."""
    port = free_port()
    start = time.perf_counter()
    started = []
    for rank, argv in enumerate(commands):
        child_env = bare_env(env, rank, len(commands), port) if way == "bare" else env
        started.append(
            subprocess.Popen(
                [*argv, "--ckpt-dir", str(ckpt)],
                env=child_env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
    failed = []
    for process in started:
        _, err = process.communicate(timeout=600)
        if process.returncode != 0:
            failed.append(err.decode(errors="replace")[-400:])
    took = time.perf_counter() - start
    if failed:
        raise SystemExit(f"{way} failed: {failed[0]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--src", type=Path, default=ROOT / "src")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {**bench_env(work), "NO_COLOR": "1"}
        env.pop("CUDA_VISIBLE_DEVICES", None)  # xpulaunch picks the GPUs itself
        # torchrun and bare see exactly the GPUs xpulaunch picks on an idle host.
        masked = {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(args.gpus))}
        found = ways(args.gpus, args.steps, args.src, work)
        times: dict[str, list[float]] = {name: [] for name in found}
        for i in range(args.runs + 1):  # round 0 warms caches and bytecode
            for name, commands in found.items():
                run_env = env if name == "xpulaunch" else masked
                took = timed(name, commands, run_env, work / f"ckpt-{name}-{i}")
                if i:
                    times[name].append(took)
                    print(f"  round {i} {name}: {took:.2f} s", flush=True)
    report(times, args)


def report(times: dict[str, list[float]], args: argparse.Namespace) -> None:
    bare = statistics.median(times["bare"])
    print(f"{args.gpus} GPUs, {args.runs} rounds, {args.steps} steps, python "
          f"{sys.version.split()[0]}")  # fmt: skip
    for name, values in times.items():
        median = statistics.median(values)
        paired = statistics.median(v / b for v, b in zip(values, times["bare"], strict=True))
        print(f"  {name:>9}: median {median:6.2f} s, {median / bare:5.3f}x bare "
              f"(paired median {paired:5.3f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
