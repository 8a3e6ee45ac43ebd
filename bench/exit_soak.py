"""How often a two-rank CPU run of a training script fails, with the machine's cores kept busy.

    .venv/bin/python bench/exit_soak.py [--runs N] [--hogs K] [--script PATH]

Each run is ``xpulaunch torchrun --standalone --nproc-per-node 2 --gpus none SCRIPT --steps 2``
in a fresh folder; ``--hogs`` busy-loop processes (default: one per core) run beside it, the
load under which torch 2.13's gloo threads still release the last backward pass's work when
the interpreter shuts down (SIGABRT, "terminate called without an active exception";
``examples/train.py``'s ``leave`` says why). Prints every failed run's exit status and
xpulaunch's line about the first failure, then the count. To compare with the example before
its fix: ``git show 5383de9:examples/train.py > /tmp/train_old.py``, then
``--script /tmp/train_old.py``.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_run(script: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "xpulaunch", "torchrun", "--standalone", "--nproc-per-node", "2",
        "--gpus", "none", str(script), "--ckpt-dir", str(folder / "ckpt"), "--steps", "2",
    ]  # fmt: skip
    return subprocess.run(
        command, check=False, cwd=folder, capture_output=True, text=True, timeout=300
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--script", type=Path, default=ROOT / "examples" / "train.py")
    args = parser.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    statuses: collections.Counter[int] = collections.Counter()
    try:
        for number in range(1, args.runs + 1):
            with tempfile.TemporaryDirectory(prefix="exit-soak-") as folder:
                done = one_run(args.script.resolve(), Path(folder))
            statuses[done.returncode] += 1
            if done.returncode != 0:
                why = [line for line in done.stderr.splitlines() if "failed first" in line]
                print(f"run {number}: exit status {done.returncode}: {why[:1]}", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    failed = args.runs - statuses[0]
    print(f"{args.script}: {failed} of {args.runs} runs failed ({args.hogs} busy processes); "
          f"exit statuses {dict(sorted(statuses.items()))}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
