"""Where a process that uses NVML spends its last milliseconds: fresh Python processes that
init NVML, ask each GPU's memory, then wait a little before or after, with and without
nvmlShutdown. Interleaved rounds; median and mean wall time of each variant.

    python3 bench/nvml_tick.py [--runs 12]

If the times move in steps whatever the wait (a wait of 10 ms costing 0 or 25 ms), something
started by nvmlInit rounds the process's end up to its own period.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

BODY = """
import time, pynvml
time.sleep({before})
pynvml.nvmlInit()
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
time.sleep({after})
{shutdown}
time.sleep({late})
"""


def variants() -> dict[str, str]:
    out = {}
    for shutdown in (False, True):
        stop = "pynvml.nvmlShutdown()" if shutdown else ""
        tag = "shutdown" if shutdown else "no shutdown"
        for after in (0, 10, 20, 30, 40):
            out[f"{tag}, {after} ms after init"] = BODY.format(
                before=0, after=after / 1e3, shutdown=stop, late=0
            )
        out[f"{tag}, 30 ms before init"] = BODY.format(before=0.03, after=0, shutdown=stop, late=0)
    out["shutdown, then 30 ms"] = BODY.format(
        before=0, after=0, shutdown="pynvml.nvmlShutdown()", late=0.03
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=12)
    args = parser.parse_args()
    programs = variants()
    # Bytecode cached, as an installed package has it (a wheel installed with --no-compile
    # would be compiled again by every run).
    env = {**os.environ, "PYTHONPYCACHEPREFIX": tempfile.mkdtemp(prefix="nvml-tick-pyc-")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    times: dict[str, list[float]] = {name: [] for name in programs}
    for round_ in range(args.runs + 1):
        for name, code in programs.items():
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, env=env)
            if round_ > 0:  # round 0 warms the caches up
                times[name].append((time.perf_counter() - started) * 1e3)
    print(f"{'variant':<32} {'median':>8} {'mean':>8} {'min':>8}  all (ms)")
    for name, values in times.items():
        spread = " ".join(f"{v:.0f}" for v in sorted(values))
        print(f"{name:<32} {statistics.median(values):>8.1f} {statistics.mean(values):>8.1f} "
              f"{min(values):>8.1f}  {spread}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
