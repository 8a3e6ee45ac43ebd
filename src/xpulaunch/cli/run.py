"""``xpulaunch [run] [OPTIONS] PROGRAM [ARGS]...``: plan, lease devices, run and supervise."""

from __future__ import annotations

import os
from typing import Any

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS
from xpulaunch.cli.group import AFTER_DASHDASH, ProgramCommand
from xpulaunch.cli.run_options import launch, run_parameters


def run_command(program: tuple[str, ...], dry_run: bool, as_json: bool, **values: Any) -> int:
    """Launch PROGRAM on selected accelerators and supervise it.

    A PROGRAM ending in .py runs under this Python; anything else is looked up on PATH.
    xpulaunch's own options may also follow PROGRAM; everything else after PROGRAM, and
    everything after --, is passed to PROGRAM.
    """
    warn_torchrun_options(program)
    return launch(program, values, dry_run=dry_run, as_json=as_json)


def warn_torchrun_options(program: tuple[str, ...]) -> None:
    """One line for each torchrun option written after PROGRAM (not after ``--``): it goes
    to PROGRAM, which is what ``run`` does with an argument it does not know."""
    explicit = click.get_current_context().meta.get(AFTER_DASHDASH, 0)
    args = program[1 : len(program) - explicit]
    if not any(arg.startswith("-") for arg in args):
        return  # nothing to look for: the torchrun command need not be built
    from xpulaunch.cli.torchrun import torchrun_options_in

    script = os.path.basename(program[0])
    for name in torchrun_options_in(args):
        click.echo(
            f"xpulaunch: warning: {name} (a torchrun option) goes to {script}; put it after "
            f"-- if it is meant for {script}, or run xpulaunch torchrun ... {script}",
            err=True,
        )


run = ProgramCommand(
    "run",
    params=[
        *run_parameters(),
        click.Argument(["program"], nargs=-1, required=True, type=click.UNPROCESSED),
    ],
    callback=run_command,
    help=run_command.__doc__,
    context_settings=CONTEXT_SETTINGS,
)
