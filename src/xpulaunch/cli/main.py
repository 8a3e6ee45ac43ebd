"""Entry point: one ``main()`` that turns every XpulaunchError into one line and an exit code.

Subcommands are imported lazily so that ``xpulaunch run --dry-run`` loads only what it needs
(the probe, psutil and the supervisor stay out of a dry run with ``--inventory``).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

import click

from xpulaunch import __version__
from xpulaunch.errors import XpulaunchError

# name -> "module:attribute"; each command lives in its own module (hatch's layout).
COMMANDS = {
    "run": "xpulaunch.cli.run:run",
    "devices": "xpulaunch.cli.devices:devices",
    "llama": "xpulaunch.cli.llama:llama",
    "status": "xpulaunch.cli.status:status",
}
_GROUP_FLAGS = {"--help", "-h", "--version"}


class _DefaultRunGroup(click.Group):
    """A group whose unknown first word means ``run``: ``xpulaunch train.py --gpus auto``."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attr)
        return command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in COMMANDS and args[0] not in _GROUP_FLAGS:
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultRunGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="xpulaunch")
def cli() -> None:
    """Launch and supervise multi-GPU jobs and llama.cpp servers.

    \b
    xpulaunch train.py --gpus auto          run a script on the free GPUs
    xpulaunch devices                       list accelerators
    xpulaunch llama -m model.gguf --gpus 2  serve a model pinned to 2 GPUs
    """


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI; exit with the command's status."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("XPULAUNCH_DEBUG") == "1"
    try:
        status = cli.main(args=args, prog_name="xpulaunch", standalone_mode=False)
    except XpulaunchError as exc:
        if debug:
            raise
        _fail(exc.message, exc.exit_code)
    except click.exceptions.Abort:
        _fail("interrupted", 130)
    except click.ClickException as exc:
        if debug:
            raise
        hint = ""
        ctx = getattr(exc, "ctx", None)
        if ctx is not None:
            hint = f" (see '{ctx.command_path} --help')"
        _fail(exc.format_message() + hint, exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    sys.exit(status if isinstance(status, int) else 0)


def _fail(message: str, code: int) -> None:
    one_line = " ".join(message.split())
    click.echo(f"xpulaunch: error: {one_line}", err=True)
    sys.exit(code)
