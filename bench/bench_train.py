"""Wall time of a whole one-worker training run: bare, under xpulaunch, under torchrun.

    .venv/bin/python bench/bench_train.py [--runs 5] [--steps 2000] [--src DIR]

Each round runs ``examples/train.py`` three ways, interleaved, each with a fresh checkpoint
folder (so nothing resumes): started bare (``python examples/train.py``, the script's own
defaults for the rank variables), as ``xpulaunch examples/train.py --gpus auto`` (the console
script; on a one-GPU host that is the GPU) and as ``torchrun --standalone --nproc-per-node 1
examples/train.py``. Every Python command gets a bytecode cache, as an installed package has.
Prints the median wall time of each, its ratio to bare's median, and the median of the
per-round ratios (paired). Goal: xpulaunch within 3% of bare.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench_compare import script_for  # the same directory: run as bench/bench_train.py
from bench_supervisor import bench_env, timed_once

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train.py"


def commands(work: Path, steps: int, src: Path) -> dict[str, list[str]]:
    py = sys.executable
    (work / "bin").mkdir()
    script = script_for(src, work / "bin")
    found = {
        "bare": [py, str(TRAIN)],
        "xpulaunch": [py, str(script), str(TRAIN), "--gpus", "auto"],
    }
    torchrun = shutil.which("torchrun", path=str(Path(py).parent)) or shutil.which("torchrun")
    if torchrun is not None:
        found["torchrun"] = [torchrun, "--standalone", "--nproc-per-node", "1", str(TRAIN)]
    return {name: [*argv, "--steps", str(steps)] for name, argv in found.items()}


def measure(
    found: dict[str, list[str]], env: dict[str, str], runs: int, work: Path
) -> dict[str, list[float]]:
    """Seconds of every command, ``runs`` interleaved rounds after one warm-up round."""
    times: dict[str, list[float]] = {name: [] for name in found}
    for i in range(runs + 1):
        for name, argv in found.items():
            ckpt = work / f"ckpt-{name}-{i}"
            took = timed_once([*argv, "--ckpt-dir", str(ckpt)], env)
            if i:
                times[name].append(took)
                print(f"  round {i} {name}: {took:.3f} s", flush=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument(
        "--src",
        type=Path,
        default=ROOT / "src",
        help="import xpulaunch from here (e.g. a pip install --target)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = bench_env(work)
        times = measure(commands(work, args.steps, args.src), env, args.runs, work)
    bare = statistics.median(times["bare"])
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.runs} rounds, "
          f"{args.steps} steps")  # fmt: skip
    for name, values in times.items():
        median = statistics.median(values)
        # Paired: each round's run against that round's bare run, so a slow minute of the
        # machine counts against both.
        paired = statistics.median(v / b for v, b in zip(values, times["bare"], strict=True))
        print(f"  {name:>10}: median {median:7.3f} s  ({median / bare:.4f}x bare; paired "
              f"{paired:.4f}x; min {min(values):.3f}, max {max(values):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
