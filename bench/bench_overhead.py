"""What starting a program costs under xpulaunch, as a ratio of what it costs under torchrun.

    .venv/bin/python bench/bench_overhead.py [--runs N] [--src DIR]
    .venv/bin/python bench/bench_overhead.py --against REV   (or --against-src DIR)

Paired in one run, round by round: the bare ``/bin/true``, ``xpulaunch --gpus none --
/bin/true`` (the console script, as users run it; ``--gpus 1`` probes, plans and leases a
GPU) and ``torchrun --nproc-per-node 1 --no-python /bin/true``. ``--against REV`` adds the
``xpulaunch`` of another commit (a temporary git worktree; ``--against-src`` names the ``src``
folder of another version, for a machine without the git history) to the same rounds, so the
cost of a change is measured against the same machine minute. Every Python command gets a
bytecode cache, as an installed package has.

The figure is the launcher's overhead, the median over rounds of (launcher - bare), and the
ratio of ours to torchrun's. Goal: at most 1/10.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_compare import script_for  # the same directory: run as bench/bench_overhead.py
from bench_supervisor import bench_env, timed_once

ROOT = Path(__file__).resolve().parent.parent
TRUE = shutil.which("true") or "/bin/true"


def commands(
    work: Path, src: Path, against: tuple[str, Path] | None, gpus: str = "none"
) -> dict[str, list[str]]:
    py = sys.executable
    ours = work / "ours"
    ours.mkdir()
    found = {
        "bare": [TRUE],
        "xpulaunch": [py, str(script_for(src, ours)), "--gpus", gpus, "--", TRUE],
    }
    if against is not None:
        name, src = against
        theirs = work / "against"
        theirs.mkdir()
        script = script_for(src, theirs)
        found[f"xpulaunch@{name}"] = [py, str(script), "--gpus", gpus, "--", TRUE]
    torchrun = shutil.which("torchrun", path=str(Path(py).parent)) or shutil.which("torchrun")
    if torchrun is not None:
        found["torchrun"] = [torchrun, "--nproc-per-node", "1", "--no-python", TRUE]
    return found


def measure(found: dict[str, list[str]], env: dict[str, str], runs: int) -> dict[str, list[float]]:
    """Milliseconds of every command, ``runs`` interleaved rounds after one warm-up round."""
    times: dict[str, list[float]] = {name: [] for name in found}
    for i in range(runs + 1):
        for name, argv in found.items():
            took = timed_once(argv, env)
            if i:
                times[name].append(took * 1e3)
    return times


def report(times: dict[str, list[float]]) -> None:
    bare = times.pop("bare")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {len(bare)} rounds; "
          f"bare /bin/true median {statistics.median(bare):.2f} ms")  # fmt: skip
    overhead = {}
    for name, values in times.items():
        paired = [v - b for v, b in zip(values, bare, strict=True)]
        q1, median, q3 = statistics.quantiles(paired, n=4)
        overhead[name] = median
        print(f"  {name:>22}: overhead median {median:8.1f} ms (quartiles {q1:.1f}-{q3:.1f})")
    if "torchrun" in overhead:
        for name, value in overhead.items():
            if name != "torchrun":
                print(f"  {name:>22} / torchrun: {value / overhead['torchrun']:.3f} "
                      f"(1/{overhead['torchrun'] / value:.1f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--src",
        type=Path,
        default=ROOT / "src",
        help="import xpulaunch from here (e.g. a pip install --target)",
    )
    parser.add_argument(
        "--gpus", default="none", help="xpulaunch's --gpus (1: probe, plan and lease one GPU)"
    )
    parser.add_argument("--against", metavar="REV", help="also time xpulaunch at this commit")
    parser.add_argument("--against-src", metavar="DIR", type=Path, help="... or from this src")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        against = None
        if args.against_src:
            against = (str(args.against_src), args.against_src.resolve())
        elif args.against:
            tree = work / "tree"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                            str(tree), args.against], check=True)  # fmt: skip
            against = (args.against, tree / "src")
        try:
            report(
                measure(commands(work, args.src, against, args.gpus), bench_env(work), args.runs)
            )
        finally:
            if args.against:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(work / "tree")], check=False)  # fmt: skip


if __name__ == "__main__":
    main()
