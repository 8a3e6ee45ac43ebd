"""``xpulaunch [run] [OPTIONS] PROGRAM [ARGS]...``

The options are data (:mod:`xpulaunch.cli.spec`) and :func:`run` does not import click: a
well-formed command line is parsed without it (issue 4's start-up budget); click builds the
same command from :data:`RUN` for help and errors (:mod:`xpulaunch.cli.clickspec`).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import TYPE_CHECKING

from xpulaunch.cli.lease_options import LEASE_OPTIONS, LeaseSettings
from xpulaunch.cli.output import echo
from xpulaunch.cli.plan_options import PLAN_OPTIONS, percent_option, size_option
from xpulaunch.cli.spec import CHOICE, DIR, FLAG, FLOAT, INT, SWITCH, CommandSpec, Opt
from xpulaunch.errors import UsageError
from xpulaunch.model import DeviceMap, Plan
from xpulaunch.proc.options import DEFAULT_MAX_RESTARTS

if TYPE_CHECKING:
    from typing import Any

_RUN_ONLY = (
    Opt(
        "--nproc-per-node",
        dest="nproc_per_node",
        default="1",
        show_default=True,
        metavar="N|auto",
        help="Worker processes; auto = one per selected device.",
    ),
    Opt("--isolate", dest="isolate", kind=FLAG, help="Each worker sees only its own devices."),
    Opt(
        "--device-map",
        dest="device_map",
        kind=CHOICE,
        choices=tuple(m.value for m in DeviceMap),
        help="Device map exported as XPULAUNCH_DEVICE_MAP (default: sequential for one device, "
        "balanced for several).",
    ),
    Opt("--master-addr", dest="master_addr", default="127.0.0.1", show_default=True),
    Opt(
        "--master-port",
        dest="master_port",
        kind=INT,
        low=1,
        high=65535,
        help="Default: a free port.",
    ),
)

# What shapes supervision; proc.options.options_from_kwargs says what the values mean.
SUPERVISOR_OPTIONS = (
    Opt(
        "--restart",
        dest="restart",
        kind=CHOICE,
        choices=("no", "on-failure", "always"),
        envvar="XPULAUNCH_RESTART",
        help="When workers are started again. Default: no, or on-failure when "
        "--max-restarts is given.",
    ),
    Opt(
        "--max-restarts",
        dest="max_restarts",
        kind=INT,
        envvar="XPULAUNCH_MAX_RESTARTS",
        metavar="N",
        help=f"Restarts allowed inside the stability window (-1: no limit; default "
        f"{DEFAULT_MAX_RESTARTS} with --restart).",
    ),
    Opt(
        "--backoff",
        dest="backoff",
        default="1:30:2",
        show_default=True,
        envvar="XPULAUNCH_BACKOFF",
        metavar="FIRST[:MAX[:FACTOR]]",
        help="Seconds before the first restart, the cap, and the growth factor; 0 restarts "
        "at once.",
    ),
    Opt(
        "--stable-window",
        dest="stable_window",
        kind=FLOAT,
        default=60.0,
        show_default=True,
        envvar="XPULAUNCH_STABLE_WINDOW",
        metavar="SECONDS",
        help="A run that lasted this long resets the restart count.",
    ),
    Opt(
        "--gang",
        dest="gang",
        kind=SWITCH,
        off_names=("--no-gang",),
        help="Restart all workers when one fails (default without --isolate) or each on "
        "its own (default with --isolate).",
    ),
    Opt(
        "--grace",
        dest="grace",
        kind=FLOAT,
        default=10.0,
        show_default=True,
        envvar="XPULAUNCH_GRACE",
        metavar="SECONDS",
        help="After the stop signal, wait this long before SIGKILL.",
    ),
    Opt(
        "--log-dir",
        dest="log_dir",
        kind=DIR,
        envvar="XPULAUNCH_LOG_DIR",
        help="Write DIR/attempt_N/WORKER.log for every worker and attempt.",
    ),
    Opt(
        "--ranks",
        "--local-ranks-filter",
        dest="ranks",
        metavar="LIST",
        help="Show only these workers on the console, e.g. 0,2 (log files keep all).",
    ),
    Opt(
        "--no-color",
        dest="no_color",
        kind=FLAG,
        help="No colour in worker prefixes (also NO_COLOR=1).",
    ),
)


def run(program: tuple[str, ...], dry_run: bool, as_json: bool, **options: Any) -> int:
    """Launch PROGRAM on selected accelerators and supervise it.

    A PROGRAM ending in .py runs under this Python; anything else is looked up on PATH.
    xpulaunch's own options may also follow PROGRAM; everything else after PROGRAM, and
    everything after --, is passed to PROGRAM.
    """
    leases = LeaseSettings.pop_from(options)
    kwargs = _plan_kwargs(options)
    if dry_run:
        from xpulaunch import api

        # Leases are this host's: a plan for another machine's --inventory ignores them.
        held = None if kwargs["inventory"] else leases.manager().unavailable()
        plan = api.plan(list(program), **kwargs, unavailable=held, must_exist=False)
        _print_plan(plan, as_json)
        return 0
    if as_json:
        raise UsageError("--json goes with --dry-run")
    return _execute(list(program), kwargs, leases, options)


RUN = CommandSpec(
    "run",
    (*PLAN_OPTIONS, *_RUN_ONLY, *SUPERVISOR_OPTIONS, *LEASE_OPTIONS),
    run,
    run.__doc__ or "",
    program=True,
)


def _print_plan(plan: Plan, as_json: bool) -> None:
    from xpulaunch import api

    if as_json:
        echo(json.dumps(api.plan_document(plan), indent=2))
    else:
        from xpulaunch.cli.render import plan_text

        echo(plan_text(plan))


def _execute(
    program: list[str], kwargs: dict[str, Any], leases: LeaseSettings, options: dict[str, Any]
) -> int:
    """Allocate devices under the lease lock, then run the plan until the job is over."""
    # Probe once, outside the allocation lock (only planning runs under it), in a forked
    # child: NVML's ~20 MiB never become the supervisor's, and the probe runs while this
    # process imports the supervisor.
    probing = None
    if kwargs["inventory"] is None:
        from xpulaunch.probing.isolated import ForkedProbe

        probing = ForkedProbe(kwargs["parent_env"])
    with probing or contextlib.nullcontext():
        from xpulaunch import api
        from xpulaunch.cli.lease_options import WaitReporter
        from xpulaunch.proc.launch import check_ranks, run_plan
        from xpulaunch.proc.options import options_from_kwargs

        run_options = options_from_kwargs(options)  # validate before anything is reserved
        if probing is not None:
            kwargs["inventory"] = probing.result()
    with WaitReporter() as reporter:
        plan, lease = leases.allocate(
            lambda unavailable: api.plan(program, **kwargs, unavailable=unavailable),
            on_wait=reporter,
            command=["xpulaunch", *program],
        )
    with lease:
        # Checked before the summary line: a mistake prints one line, not a start and an error.
        check_ranks(run_options.console_ranks, [w.name for w in plan.workers])
        echo(f"xpulaunch: {_summary(plan)}", err=True)
        # Workers and the guardian inherit the lease fds; closing ours at the end never
        # unlocks a device that a surviving process of the job still holds.
        return run_plan(
            plan, kwargs["parent_env"], run_options, lease_fds=lease.fds, release_leases=True,
            job_id=lease.job_id,
        )  # fmt: skip


def _plan_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    return {
        "gpus": options["gpus"],
        "backend": options["backend"],
        "nproc_per_node": _nproc(options["nproc_per_node"]),
        "isolate": options["isolate"],
        "min_free_memory_bytes": size_option(options["min_free_memory"], "--min-free-memory"),
        "max_utilization_percent": percent_option(options["max_utilization"], "--max-utilization"),
        "device_map": options["device_map"],
        "master_addr": options["master_addr"],
        "master_port": options["master_port"],
        "inventory": options["inventory"],
        "parent_env": dict(os.environ),
    }


def _nproc(value: str) -> int | None:
    if value.strip().lower() == "auto":
        return None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise UsageError(f"--nproc-per-node {value!r}: expected a count of at least 1, or auto")
    return count


def _summary(plan: Plan) -> str:
    """One line before the workers start: where they run, and why on the CPU."""
    workers = f"{len(plan.workers)} worker{'s' if len(plan.workers) != 1 else ''}"
    if plan.devices:
        where = ", ".join(u.label() for u in plan.devices)
        return f"{plan.backend.value} on {where}; {workers}"
    why = next((n for n in plan.notes if "CPU" in n), "running on the CPU")
    return f"cpu: {why}; {workers}"
