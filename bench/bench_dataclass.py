"""xpulaunch._dataclass against dataclasses, paired in one run (issue 4: start-up time).

    .venv/bin/python bench/bench_dataclass.py [--runs 15] [--quick]

Prints, for the stdlib and for ours: the cost of creating one class (decorator included,
the class statement itself measured apart), the per-instance costs (the supervisor builds one
7-field frozen slotted status per worker per loop iteration), and fresh interpreters that import
the implementation and define 30 classes the way the launch path does. Timings depend on the
machine and its load: compare only figures taken in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path

from xpulaunch import _dataclass

SRC = Path(_dataclass.__file__).resolve().parents[1]
KITS = {
    "stdlib": (dataclasses.dataclass, dataclasses.field),
    "ours": (_dataclass.dataclass, _dataclass.field),
}


def status_class(dataclass: Callable[..., object], field: Callable[..., object]) -> type:
    @dataclass(frozen=True, slots=True)
    class WorkerStatus:
        name: str
        state: str
        pid: int | None
        restarts: int
        attempt: int
        exit_code: int | None
        ready: bool

    return WorkerStatus


def device_class(dataclass: Callable[..., object], field: Callable[..., object]) -> type:
    @dataclass(frozen=True, slots=True)
    class Device:
        vendor: str
        index: int
        name: str | None = None
        pci_bus_id: str | None = None
        uuid: str | None = None
        integrated: bool = False
        tiles: int = 1
        memory_total_bytes: int | None = None
        memory_used_bytes: int | None = None
        utilization_percent: float | None = None
        mig_devices: tuple[str, ...] = ()
        extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    return Device


def plain_class(dataclass: Callable[..., object], field: Callable[..., object]) -> type:
    class WorkerStatus:  # the class statement alone: what both decorators start from
        name: str
        state: str
        pid: int | None

    return WorkerStatus


def best_us(action: Callable[[], object], number: int, repeat: int = 5) -> float:
    """Best of ``repeat`` means, in microseconds (the least disturbed by other processes)."""
    return min(timeit.repeat(action, number=number, repeat=repeat)) / number * 1e6


def class_creation(quick: bool) -> None:
    number = 100 if quick else 400
    print("class creation (us per class, best of 5):")
    for build in (plain_class, status_class, device_class):
        row = {kit: best_us(lambda k=kit, b=build: b(*KITS[k]), number) for kit in KITS}
        print(f"  {build.__name__:14} stdlib {row['stdlib']:8.1f}   ours {row['ours']:8.1f}")


def instance_costs(quick: bool) -> None:
    number = 20_000 if quick else 200_000
    cases: dict[str, Callable[[type], Callable[[], object]]] = {
        "status, 7 positional": lambda c: lambda: c("w0", "ready", 123, 0, 1, None, True),
        "status, 7 keywords": lambda c: (
            lambda: c(
                name="w0", state="ready", pid=123, restarts=0, attempt=1, exit_code=None, ready=True
            )
        ),
    }
    print("per instance (us, best of 5):")
    status = {kit: status_class(*KITS[kit]) for kit in KITS}
    device = {kit: device_class(*KITS[kit]) for kit in KITS}
    for label, make in cases.items():
        row = {kit: best_us(make(status[kit]), number) for kit in KITS}
        print(f"  {label:28} stdlib {row['stdlib']:6.3f}   ours {row['ours']:6.3f}")
    one = {kit: status[kit]("w0", "ready", 123, 0, 1, None, True) for kit in KITS}
    two = {kit: status[kit]("w0", "ready", 123, 0, 1, None, True) for kit in KITS}  # equal
    dev = {kit: device[kit]("nvidia", 0, uuid="GPU-1", tiles=2) for kit in KITS}
    replace = {"stdlib": dataclasses.replace, "ours": _dataclass.replace}
    others: dict[str, Callable[[str], Callable[[], object]]] = {
        "device, 2 pos + 2 keywords": lambda k: lambda: device[k]("nvidia", 0, uuid="G", tiles=2),
        "status == equal status": lambda k: lambda: one[k] == two[k],
        "hash(status)": lambda k: lambda: hash(one[k]),
        "repr(status)": lambda k: lambda: repr(one[k]),
        "replace(device, tiles=4)": lambda k: lambda: replace[k](dev[k], tiles=4),
    }
    for label, make_action in others.items():
        row = {kit: best_us(make_action(kit), number // 4) for kit in KITS}
        print(f"  {label:28} stdlib {row['stdlib']:6.3f}   ours {row['ours']:6.3f}")


THIRTY_CLASSES = """
import sys, time
start = time.perf_counter()
package = type(sys)("xpulaunch")  # our module without xpulaunch/__init__.py's own imports
package.__path__ = [{src!r}]
sys.modules["xpulaunch"] = package
from {module} import dataclass, field
imported = time.perf_counter()
for i in range(30):
    @dataclass(frozen=True, slots=True)
    class Status:
        name: str
        state: str
        pid: int | None
        restarts: int = 0
        attempt: int = 0
        exit_code: int | None = None
        extra: dict = field(default_factory=dict, compare=False)
print((imported - start) * 1000, (time.perf_counter() - imported) * 1000)
"""


def medians_ms(cases: dict[str, str], runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Per case, the medians of the wall time of ``python -c CODE`` and of each number it prints
    (ms); the cases take turns, so that a change in the machine's load touches them alike."""
    samples: dict[str, list[list[float]]] = {label: [] for label in cases}
    for i in range(runs + 1):  # the first round warms up and writes the bytecode cache
        for label, code in cases.items():
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", code], check=True, env=env, capture_output=True, text=True
            )
            wall_ms = (time.perf_counter() - start) * 1000
            if i:
                samples[label].append([wall_ms, *map(float, done.stdout.split())])
    return {
        label: [statistics.median(column) for column in zip(*rows, strict=True)]
        for label, rows in samples.items()
    }


def fresh_interpreters(runs: int) -> None:
    # An installed package has bytecode; this machine sets PYTHONDONTWRITEBYTECODE=1.
    env = {**os.environ, "PYTHONPYCACHEPREFIX": tempfile.mkdtemp(prefix="bench-dc-pyc-")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    src = str(SRC / "xpulaunch")
    cases = {
        "python -c pass": "pass",
        "import dataclasses + 30 classes": THIRTY_CLASSES.format(src=src, module="dataclasses"),
        "import ours + 30 classes": THIRTY_CLASSES.format(src=src, module="xpulaunch._dataclass"),
    }
    print(
        f"fresh interpreter, median of {runs}, taking turns (ms; import and classes timed inside):"
    )
    results = medians_ms(cases, runs, env)
    for label, (wall_ms, *inside_ms) in results.items():
        inside = "   import {:6.2f}   30 classes {:6.2f}".format(*inside_ms) if inside_ms else ""
        print(f"  {label:34} {wall_ms:7.1f}{inside}")
    saved = results["import dataclasses + 30 classes"][0] - results["import ours + 30 classes"][0]
    print(f"  saved by ours: {saved:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}")
    class_creation(args.quick)
    instance_costs(args.quick)
    fresh_interpreters(3 if args.quick else args.runs)


if __name__ == "__main__":
    main()
