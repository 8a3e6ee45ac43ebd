"""An xpulaunch-like parent for the signal and orphan tests: supervise a hand-built plan.

``python drive_plan.py SPEC.json`` where SPEC has ``argvs`` (one argv per worker),
``isolate`` and RunRequest fields. Errors end as one line, like ``xpulaunch``'s ``main()``.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys

from xpulaunch.errors import XpulaunchError
from xpulaunch.launch.request import RunRequest
from xpulaunch.launch.run import supervise
from xpulaunch.model import Backend, Plan, WorkerPlan
from xpulaunch.supervisor.restart import RestartMode


def main() -> int:
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1` shows where a hung run is stuck
    with open(sys.argv[1], encoding="utf-8") as handle:
        spec = json.load(handle)
    argvs = spec.pop("argvs")
    size = str(len(argvs))
    workers = tuple(
        WorkerPlan(str(i), i, i, tuple(argv), {"RANK": str(i), "WORLD_SIZE": size})
        for i, argv in enumerate(argvs)
    )
    plan = Plan(Backend.CPU, (), workers, None, isolate=spec.pop("isolate"))
    if "restart" in spec:
        spec["restart"] = RestartMode(spec["restart"])
    if "ranks" in spec:
        spec["ranks"] = frozenset(spec["ranks"])
    print(f"driver pid {os.getpid()}", file=sys.stderr, flush=True)
    try:
        return supervise(plan, RunRequest(program=("job",), **spec), dict(os.environ))
    except XpulaunchError as exc:
        print(f"xpulaunch: error: {exc.message}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
