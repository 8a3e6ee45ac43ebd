"""Median wall time of a dry-run plan (issue 2 goal: under 80 ms on the 2-core dev machine).

    .venv/bin/python bench/bench_dry_run.py [--runs 30]

Paired in one run against the floor every Python CLI pays: ``python -c pass`` and
``python -c "import click"`` with the same interpreter.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INVENTORY = ROOT / "tests" / "fixtures" / "inventories" / "8x-h100.json"
XPULAUNCH = [sys.executable, "-m", "xpulaunch"]


def median_ms(argv: list[str], runs: int, env: dict[str, str]) -> float:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)  # warm-up
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--no-bytecode",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE as inherited (every run recompiles every module)",
    )
    args = parser.parse_args()
    runs = args.runs
    env = dict(os.environ)
    if not args.no_bytecode:
        # An installed package has bytecode (pip compiles at install); this machine sets
        # PYTHONDONTWRITEBYTECODE=1, so give every run alike a bytecode cache.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="bench-dry-run-pyc-")
    print(f"bytecode: {'recompiled every run' if args.no_bytecode else 'cached'}")
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import click'": [sys.executable, "-c", "import click"],
        "xpulaunch run --dry-run --json": [
            *XPULAUNCH, "run", "--dry-run", "--json", "--inventory", str(INVENTORY),
            "--gpus", "4", "--nproc-per-node", "auto", "--", "python", "-c", "pass",
        ],
    }  # fmt: skip
    results = {name: median_ms(argv, runs, env) for name, argv in cases.items()}
    floor = results["python -c pass"]
    for name, ms in results.items():
        print(f"{name:34s} {ms:7.1f} ms median of {runs}  ({ms / floor:4.2f}x python -c pass)")
    ours = results["xpulaunch run --dry-run --json"]
    print(f"goal: < 80 ms -> {'met' if ours < 80 else 'NOT met'}")


if __name__ == "__main__":
    main()
