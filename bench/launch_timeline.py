"""Where xpulaunch's own start goes: a timeline of one launch, from its first import to each
worker's spawn (a diagnostic, not a benchmark: wrapping the calls costs a little).

    python bench/launch_timeline.py [--no-cgroup] -- --gpus none --nproc-per-node 2 -- /bin/true

Prints, in ms since then: the CLI imported, the supervisor imported, the lease allocated (the
plan is made inside it), and each ``Popen`` with the time it took: the guardian's, setpriv's
``--version`` check (once per process) and the workers' (the supervisor waits for the child's
exec; with a job cgroup the child first moves into its leaf). ``--no-cgroup`` runs the same
launch without a job cgroup.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

T0 = time.perf_counter()  # after the few standard modules above, before any of ours

MARKS: list[tuple[str, float]] = []


def mark(name: str) -> None:
    MARKS.append((name, (time.perf_counter() - T0) * 1e3))


def timed(owner: Any, name: str) -> None:
    """Replace ``owner.name`` by a wrapper that marks its start and end."""
    inner: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        mark(f"{name} start")
        try:
            return inner(*args, **kwargs)
        finally:
            mark(f"{name} end")

    setattr(owner, name, wrapper)


def main() -> None:
    args = sys.argv[1:]
    no_cgroup = "--no-cgroup" in args[: args.index("--")] if "--" in args else False
    launch = args[args.index("--") + 1 :] if "--" in args else args
    from xpulaunch.cli import main as cli_main

    mark("CLI imported")
    from xpulaunch.cli.lease_options import LeaseSettings
    from xpulaunch.proc import cgroup, supervisor
    from xpulaunch.proc import launch as launch_mod

    mark("supervisor imported")
    if no_cgroup:
        cgroup.JobCgroup.create = classmethod(lambda cls, job_id: (None, "off"))  # type: ignore[assignment,method-assign]
    timed(LeaseSettings, "allocate")
    timed(launch_mod, "run_plan")
    timed(supervisor, "start_guardian")
    timed(subprocess.Popen, "__init__")
    with contextlib.suppress(SystemExit):
        cli_main.main(launch)
    for name, at in MARKS:
        print(f"{at:8.1f} ms  {name.replace('__init__', 'Popen')}", file=sys.stderr)


if __name__ == "__main__":
    main()
