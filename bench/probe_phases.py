"""Where ``xpulaunch devices --json``'s time goes, phase by phase, in one process.

    python3 bench/probe_phases.py [--runs 10]

Each run is a fresh interpreter that does what ``xpulaunch devices --json`` does, in its
order, and notes the clock after each phase: click, the CLI's modules, the config files (as
the group's callback reads them), starting NVML, the probe's modules, waiting for NVML, the
probe, the document. Beside it, a bare pynvml process noted the same way. Medians of
``--runs`` are printed, in milliseconds from the interpreter's start (``time.perf_counter``
at its first line, after Python's own start-up, which both pay alike).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# An empty folder (as bench_probe.py): the checkout's pyproject.toml would be read as a config.
CWD = tempfile.mkdtemp(prefix="probe-phases-")

OURS = r"""
import time; t = [("start", time.perf_counter())]
import os, sys, json
def note(name): t.append((name, time.perf_counter()))
import click; note("import click")
from xpulaunch.cli.group import cli; note("cli group")
from xpulaunch.cli.devices import devices; note("devices command")
from xpulaunch.cli.config_files import apply_config_files
ctx = click.Context(cli); apply_config_files(ctx, None); note("config files")
from xpulaunch.probing.nvml_start import start_nvml; start_nvml(os.environ); note("start NVML")
from xpulaunch.probing import host; note("probe modules")
inventory = host.probe_from_env(os.environ, use_torch=False, report_missing=False); note("probe")
from xpulaunch.core.inventory import dumps; text = dumps(inventory); note("document")
print(json.dumps([(n, (v - t[0][1]) * 1e3) for n, v in t[1:]]), file=sys.stderr)
"""

# The same without NVML's thread: how much of the thread's start the main thread waits for.
NO_THREAD = OURS.replace("start_nvml(os.environ)", "pass")

BARE = r"""
import time; t = [("start", time.perf_counter())]
import sys, json
def note(name): t.append((name, time.perf_counter()))
import pynvml; note("import pynvml")
pynvml.nvmlInit(); note("nvmlInit")
n = pynvml.nvmlDeviceGetCount()
hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]; note("handles")
for h in hs:
    pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetPciInfo(h)
    pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    pynvml.nvmlDeviceGetUtilizationRates(h)
note("queries")
pynvml.nvmlShutdown(); note("shutdown")
print(json.dumps([(n, (v - t[0][1]) * 1e3) for n, v in t[1:]]), file=sys.stderr)
"""


def runs(code: str, count: int) -> list[tuple[str, float]]:
    # Bytecode cached for every run, as bench_probe.py does (an installed package has it; a
    # machine that sets PYTHONDONTWRITEBYTECODE would recompile every module every run).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="probe-phases-pyc-")
    seen: list[list[tuple[str, float]]] = []
    for _ in range(count + 1):  # the first writes the bytecode
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, cwd=CWD, env=env)  # fmt: skip
        seen.append(json.loads(done.stderr.strip().splitlines()[-1]))
    names = [name for name, _ in seen[1]]
    return [(name, statistics.median(r[i][1] for r in seen[1:])) for i, name in enumerate(names)]


PROFILE = r"""
import cProfile, io, os, pstats, sys, time
import click
from xpulaunch.cli.group import cli
from xpulaunch.probing.nvml_start import start_nvml
start_nvml(os.environ)
from xpulaunch.probing import host
time.sleep(0.2)  # NVML started: the profile is of the probe itself
profile = cProfile.Profile()
profile.enable()
host.probe_from_env(os.environ, use_torch=False, report_missing=False)
profile.disable()
out = io.StringIO()
pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(45)
print(out.getvalue(), file=sys.stderr)
"""


def profile() -> None:
    """One probe (its modules imported, NVML started) under cProfile, by cumulative time."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="probe-phases-pyc-")
    for _ in range(2):  # the first writes the bytecode
        done = subprocess.run([sys.executable, "-c", PROFILE], capture_output=True, text=True,
                              check=True, cwd=CWD, env=env)  # fmt: skip
    print(done.stderr)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="also profile one probe")
    args = parser.parse_args()
    if args.profile:
        profile()
    for label, code in (("xpulaunch devices --json", OURS),
                        ("the same, NVML not started in a thread", NO_THREAD),
                        ("bare pynvml process", BARE)):  # fmt: skip
        print(f"{label} (median of {args.runs}, ms since the interpreter's first line):")
        before = 0.0
        for name, at in runs(code, args.runs):
            print(f"  {name:18} at {at:7.1f}  (+{at - before:5.1f})")
            before = at


if __name__ == "__main__":
    main()
