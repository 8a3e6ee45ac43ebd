"""Where xpulaunch's own start goes: a timeline of one launch, from the interpreter's start to
each worker's spawn (a diagnostic, not a benchmark: wrapping the calls costs a little).

    XPULAUNCH_T0_NS=$(date +%s%N) python bench/launch_timeline.py [--no-cgroup] -- \\
        --gpus none --nproc-per-node 2 -- /bin/true

Runs the command line as the ``xpulaunch`` executable does (:mod:`xpulaunch.cli.entry`).
Prints, in ms since ``XPULAUNCH_T0_NS`` (the caller's clock just before it started this
Python; without it, since this script's first line), when this script's first line ran (the
interpreter's start), the entry point and the CLI imported, the ``run`` command imported (it
imports the supervisor's planning half), the probe forked and its result read, the
supervisor and the leases imported,
each planning call, the lease, the nodes' meeting, the job cgroup, and each ``Popen`` with
the time it took: the guardian's, setpriv's ``--version`` check (once per process) and the
workers' (the supervisor waits for the child's exec; with a job cgroup the child first moves
into its leaf). ``--no-cgroup`` runs the same launch without a job cgroup. Run two at once
with ``--nnodes 2 --node-rank 0/1`` for a static job's nodes.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

T0 = time.time()  # after the few standard modules above, before any of ours
START = int(os.environ.get("XPULAUNCH_T0_NS", "0")) / 1e9 or T0

MARKS: list[tuple[str, float]] = [("interpreter started", (T0 - START) * 1e3)]


def mark(name: str) -> None:
    MARKS.append((name, (time.time() - START) * 1e3))


def timed(owner: Any, name: str, label: str | None = None) -> None:
    """Replace ``owner.name`` by a wrapper that marks its start and end."""
    inner: Callable[..., Any] = getattr(owner, name)
    label = label or name

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        mark(f"{label} start")
        try:
            return inner(*args, **kwargs)
        finally:
            mark(f"{label} end")

    setattr(owner, name, wrapper)


# What to wrap in each module of ours, as soon as the launch has imported it (so that the
# launch imports every module when it would without this script).
WRAP: dict[str, list[tuple[str, str, str]]] = {
    "xpulaunch.cli.main": [],
    "xpulaunch.cli.group": [("DefaultRunGroup", "get_command", "run command import")],
    "xpulaunch.probing.isolated": [
        ("ForkedProbe", "__init__", "probe fork"),
        ("ForkedProbe", "result", "probe result"),
    ],
    "xpulaunch.proc.leases": [],
    "xpulaunch.api": [("", "plan", "api.plan")],
    "xpulaunch.cli.lease_options": [("LeaseSettings", "allocate", "allocate")],
    "xpulaunch.proc.launch": [("", "run_plan", "run_plan")],
    "xpulaunch.proc.preflight": [("", "meet", "nodes' meeting")],
    "xpulaunch.proc.supervisor": [
        ("", "job_cgroup", "job cgroup"),
        ("", "start_guardian", "start_guardian"),
    ],
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Marks when each module in WRAP is imported, and wraps its functions then;
    ``no_cgroup``: the supervisor's job cgroup is turned off."""

    def __init__(self, no_cgroup: bool) -> None:
        self.no_cgroup = no_cgroup

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in WRAP:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            mark(f"{name} imported")
            if name == "xpulaunch.proc.supervisor" and self.no_cgroup:
                module.job_cgroup = lambda job_id, env: (None, "off")
            for owner, function, label in WRAP[name]:
                timed(getattr(module, owner) if owner else module, function, label)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def main() -> None:
    args = sys.argv[1:]
    no_cgroup = "--no-cgroup" in args[: args.index("--")] if "--" in args else False
    launch = args[args.index("--") + 1 :] if "--" in args else args
    sys.meta_path.insert(0, _AfterImport(no_cgroup))
    timed(subprocess.Popen, "__init__", "Popen")
    leave, me = os._exit, os.getpid()

    def exit_after_marks(code: int) -> None:  # the command line leaves through os._exit
        for name, at in MARKS if os.getpid() == me else ():  # not in the forked probe
            print(f"{at:8.1f} ms  {name}", file=sys.stderr)
        leave(code)

    os._exit = exit_after_marks  # type: ignore[assignment]
    sys.argv = ["xpulaunch", *launch]
    from xpulaunch.cli import entry

    mark("entry imported")
    entry.console_main()


if __name__ == "__main__":
    main()
