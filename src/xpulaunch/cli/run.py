"""``xpulaunch [run] [OPTIONS] PROGRAM [ARGS]...``: plan, lease devices, run and supervise."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import click

from xpulaunch import api
from xpulaunch.cli.accelerate_options import accelerate_options, apply_accelerate_config
from xpulaunch.cli.lease_options import LeaseSettings, WaitReporter, lease_options
from xpulaunch.cli.multinode_options import (
    final_plan,
    multinode_options,
    node_kwargs,
    node_meeting,
    pop_node_request,
    warn_torchrun_options,
)
from xpulaunch.cli.operations_options import LeaseEvents, open_events, operations_options
from xpulaunch.cli.options import CONTEXT_SETTINGS, option_group
from xpulaunch.cli.plan_options import percent_option, plan_options, size_option
from xpulaunch.cli.program import ProgramCommand
from xpulaunch.cli.render import print_plan
from xpulaunch.cli.share_options import pop_share, share_options
from xpulaunch.cli.supervision_options import supervision_options
from xpulaunch.errors import UsageError
from xpulaunch.launch.options import check_run_values, parse_seconds, plan_restart_limit
from xpulaunch.model import DeviceMap, Plan

_run_only_options = option_group(
    click.option(
        "--nproc-per-node",
        default="1",
        show_default=True,
        metavar="N|auto",
        help="Worker processes; auto = one per selected device.",
    ),
    click.option("--isolate", is_flag=True, help="Each worker sees only its own devices."),
    click.option(
        "--device-map",
        type=click.Choice([m.value for m in DeviceMap]),
        help="Device map exported as XPULAUNCH_DEVICE_MAP (default: sequential for one device, "
        "balanced for several).",
    ),
    click.option(
        "--master-addr",
        help="Node 0's address for the workers' rendezvous "
        "[default: 127.0.0.1, or MASTER_ADDR / the cluster's with several nodes]",
    ),
    click.option("--master-port", type=click.IntRange(1, 65535), help="Default: a free port."),
)


@click.command(cls=ProgramCommand, context_settings=CONTEXT_SETTINGS)
@plan_options
@_run_only_options
@supervision_options
@operations_options
@multinode_options
@lease_options
@share_options
@accelerate_options
@click.argument("program", nargs=-1, required=True, type=click.UNPROCESSED)
def run(program: tuple[str, ...], dry_run: bool, as_json: bool, **options: Any) -> int:
    """Launch PROGRAM on selected accelerators and supervise it.

    A PROGRAM ending in .py runs under this Python; anything else is looked up on PATH.
    xpulaunch's own options may also follow PROGRAM; everything else after PROGRAM, and
    everything after --, is passed to PROGRAM.
    """
    warn_torchrun_options(program)
    leases = LeaseSettings.pop_from(options)
    share = pop_share(options)
    accelerate = apply_accelerate_config(options)  # may fill run's options, the nodes' too
    node_request, join_timeout = pop_node_request(options)
    options["join_timeout_s"] = parse_seconds(join_timeout, "--join-timeout", 0.0)
    kwargs = {**_plan_kwargs(options), **accelerate, "share": share}
    kwargs.update(node_kwargs(node_request, kwargs["parent_env"], options))
    if dry_run:
        check_run_values(options)  # what a real run would refuse, a dry run refuses too
        # Leases are this host's: a plan for another machine's --inventory ignores them.
        held = None if kwargs["inventory"] else leases.manager().unavailable(share)
        plan = api.plan(list(program), **kwargs, unavailable=held, must_exist=False)
        print_plan(final_plan(plan, options, kwargs["max_restarts"]), as_json)
        return 0
    if as_json:
        raise UsageError("--json goes with --dry-run")
    return _execute(list(program), kwargs, leases, options)


def _execute(
    program: list[str], kwargs: dict[str, Any], leases: LeaseSettings, options: dict[str, Any]
) -> int:
    """Allocate devices under the lease lock, then run the plan until the job is over."""
    # Probe once, outside the allocation lock (only planning runs under it), in a forked
    # child: NVML's memory never becomes the supervisor's, and the probe runs while this
    # process imports the supervisor (proc.launch, needed by no dry run).
    probing = None
    if kwargs["inventory"] is None:
        from xpulaunch.probing.isolated import ForkedProbe

        probing = ForkedProbe(kwargs["parent_env"])
    with probing or contextlib.nullcontext():
        from xpulaunch.launch.run import RunOptions, check_ranks, run_plan

        run_options = RunOptions.from_cli(options)  # validate before anything is reserved
        if probing is not None:
            kwargs["inventory"] = probing.result()
    events = open_events(run_options.events)
    with WaitReporter() as reporter:
        lease_events = LeaseEvents(events, reporter)
        plan, lease = leases.allocate(
            lambda unavailable: final_plan(
                api.plan(program, **kwargs, unavailable=unavailable),
                options,
                kwargs["max_restarts"],
            ),
            on_wait=lease_events.on_wait,
            command=["xpulaunch", *program],
            share=kwargs["share"],
        )
    with contextlib.ExitStack() as done, lease:
        if events is not None:
            done.callback(events.close)
        done.callback(lease_events.released)  # after the lease is released, before close
        # Checked before the summary line: a mistake prints one line, not a start and an error.
        check_ranks(run_options.console_ranks, [w.name for w in plan.workers])
        click.echo(f"xpulaunch: {_summary(plan)}", err=True)
        # Workers and the guardian inherit the lease fds; closing ours at the end never
        # unlocks a device that a surviving process of the job still holds.
        return run_plan(
            plan, kwargs["parent_env"], run_options, lease_fds=lease.fds, release_leases=True,
            job_id=lease.job_id, events=events, earlier_events=lease_events.got(plan, lease),
            meeting=node_meeting(plan, kwargs, options["join_timeout_s"]),
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
        "max_restarts": plan_restart_limit(options),
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
