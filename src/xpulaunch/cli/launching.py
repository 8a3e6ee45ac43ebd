"""From ``run``'s converted values (also ``torchrun``'s, mapped onto them) to a printed plan or
a supervised job: the one way both commands start a launch."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import click

from xpulaunch.cli.run_options import to_request
from xpulaunch.cli.waiting import WaitReporter
from xpulaunch.errors import UsageError


def launch(
    program: tuple[str, ...], values: dict[str, Any], *, dry_run: bool, as_json: bool
) -> int:
    """``run``'s converted values (also ``torchrun``'s, mapped) -> a plan printed, or a job."""
    env = dict(os.environ)
    if values.get("accelerate_config"):
        from xpulaunch.cli.accelerate import apply_accelerate_config

        apply_accelerate_config(values, env)  # may fill run's options, the nodes' too
    request = to_request(program, values, env)
    if dry_run:
        from xpulaunch.cli.render import print_plan
        from xpulaunch.launch.run import dry_run as plan_only

        print_plan(plan_only(request, env, _warn), as_json)
        return 0
    if as_json:
        raise UsageError("--json goes with --dry-run")
    probe = None
    if request.inventory is None:  # probes while the supervisor is imported below
        from xpulaunch.probing.isolated import ForkedProbe

        probe = ForkedProbe(env)
    with probe or contextlib.nullcontext():
        from xpulaunch.launch.run import run as launch_job

        with WaitReporter() as ui:
            return launch_job(request, env, ui, probe=probe)


def _warn(text: str) -> None:
    click.echo(f"xpulaunch: {text}", err=True)
