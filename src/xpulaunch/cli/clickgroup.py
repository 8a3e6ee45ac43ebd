"""The click group: every command, help, ``--version`` and click's error messages.

:func:`xpulaunch.cli.main.main` comes here only when the fast parser of
:mod:`xpulaunch.cli.spec` leaves a command line to click.
"""

from __future__ import annotations

import click

from xpulaunch import __version__
from xpulaunch.cli.clickspec import CONTEXT_SETTINGS, command
from xpulaunch.cli.main import COMMANDS, DEFAULT_COMMAND, GROUP_FLAGS, load_command
from xpulaunch.cli.spec import CommandSpec


class _DefaultRunGroup(click.Group):
    """A group whose unknown first word means ``run``: ``xpulaunch train.py --gpus auto``."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        found = load_command(cmd_name)
        if isinstance(found, CommandSpec):
            return command(found)
        return found if isinstance(found, click.Command) else None

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in COMMANDS and args[0] not in GROUP_FLAGS:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultRunGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="xpulaunch")
def cli() -> None:
    """Launch and supervise multi-GPU jobs and llama.cpp servers.

    \b
    xpulaunch train.py --gpus auto          run a script on the free GPUs
    xpulaunch devices                       list accelerators
    xpulaunch llama -m model.gguf --gpus 2  serve a model pinned to 2 GPUs
    """
