"""Where a c10d agent's start goes before it joins the rendezvous, on this host (diagnostic).

    python bench/agent_start_parts.py [--rounds 8]

Each round, in fresh interpreters: importing torchrun's agent with the cyclic garbage
collector on and off, and the first and second scan of installed packages' entry points that
torchrun's ``run()`` does (``importlib.metadata.entry_points``) once it has its arguments.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

IMPORT = (
    "import time; t = time.perf_counter(); {pre}import torch.distributed.run; "
    "print(time.perf_counter() - t)"
)
SCAN = (
    "import time, importlib.metadata as m; t = time.perf_counter(); "
    "m.entry_points(group='torchrun.logs_specs'); u = time.perf_counter(); "
    "m.entry_points(group='torchrun.logs_specs'); print(u - t, time.perf_counter() - u)"
)


def seconds(code: str) -> list[float]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [float(x) for x in out.stdout.split()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    rounds = parser.parse_args().rounds
    names = ("import, gc on", "import, gc off", "entry points, first scan", "entry points, second")
    found: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        found["import, gc on"] += seconds(IMPORT.format(pre=""))
        found["import, gc off"] += seconds(IMPORT.format(pre="import gc; gc.disable(); "))
        first, second = seconds(SCAN)
        found["entry points, first scan"].append(first)
        found["entry points, second"].append(second)
    for name, values in found.items():
        low, high = min(values) * 1000, max(values) * 1000
        median = statistics.median(values) * 1000
        print(f"{name:26} median {median:7.1f} ms ({low:.1f}-{high:.1f}), {len(values)} rounds")


if __name__ == "__main__":
    main()
