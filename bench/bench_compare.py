"""The CLI's overhead at another commit against this checkout, paired round by round.

    .venv/bin/python bench/bench_compare.py REV [--runs N]

Checks REV out in a temporary git worktree and runs, in each round, the bare worker, then
``xpulaunch`` of REV and of this checkout (with an empty ``--inventory``, and probing), each
through a copy of the console script pip writes, with the checkout's ``src`` first on
``sys.path``. Prints the median of each round's difference from the bare worker: a drifting
machine slows all commands of a round alike, so the paired differences are steadier than
differences of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_probe import CONSOLE_SCRIPT  # the same directory: run as bench/bench_compare.py
from bench_supervisor import bench_env, timed_once

ROOT = Path(__file__).resolve().parent.parent


def script_for(src: Path, directory: Path) -> Path:
    """pip's console script, importing xpulaunch from ``src``."""
    path = directory / "xpulaunch"
    first = f"import sys\nsys.path.insert(0, {str(src)!r})\n"
    path.write_text(CONSOLE_SCRIPT.replace("import sys\n", first, 1))
    path.chmod(0o755)
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rev")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tree = work / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree),
                        args.rev], check=True)  # fmt: skip
        try:
            run(work, tree, args.rev, args.runs)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False)  # fmt: skip


def run(work: Path, tree: Path, rev: str, runs: int) -> None:
    worker = work / "worker.py"
    worker.write_text("pass\n")
    inventory = work / "empty.json"
    inventory.write_text(json.dumps({"schema": "xpulaunch.inventory/1", "devices": []}))
    commands = {"bare": [sys.executable, str(worker)]}
    for name, src in ((rev, tree / "src"), ("this checkout", ROOT / "src")):
        (work / name.replace(" ", "_")).mkdir()
        script = [sys.executable, str(script_for(src, work / name.replace(" ", "_")))]
        commands[name] = [*script, "--gpus", "none", "--inventory", str(inventory), str(worker)]
        commands[f"{name}, probing"] = [*script, str(worker)]
    env = bench_env(work)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for i in range(runs + 1):  # round 0 warms the bytecode caches
        for name, argv in commands.items():
            took = timed_once(argv, env)
            if i:
                times[name].append(took * 1e3)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {runs} rounds; bare worker "
          f"median {statistics.median(times['bare']):.1f} ms")  # fmt: skip
    for name, values in times.items():
        if name != "bare":
            paired = [v - b for v, b in zip(values, times["bare"], strict=True)]
            q1, median, q3 = statistics.quantiles(paired, n=4)
            print(f"  {name:>24}: overhead median {median:5.1f} ms (quartiles {q1:.1f}-{q3:.1f})")


if __name__ == "__main__":
    main()
