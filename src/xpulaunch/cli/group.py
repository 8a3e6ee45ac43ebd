"""The ``xpulaunch`` group: its commands, and ``run`` as the command of a first word that is
none (``xpulaunch train.py --gpus auto``)."""

from __future__ import annotations

import difflib
import os
import shutil

import click

from xpulaunch import __version__
from xpulaunch.cli.commands import COMMANDS, load_command
from xpulaunch.cli.options import CONTEXT_SETTINGS
from xpulaunch.errors import UsageError

DEFAULT_COMMAND = "run"


class DefaultRunGroup(click.Group):
    """A group whose unknown first word means ``run``, unless it looks like a mistyped command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """``llama serve ...`` is the model router, a command of its own; ``llama`` with
        anything else is ``xpulaunch llama``."""
        if args[:2] == ["llama", "serve"]:
            from xpulaunch.cli.llama_serve import serve

            return "llama serve", serve, args[2:]
        return super().resolve_command(ctx, args)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args:  # the whole help, as `--help` shows it, rather than a usage error
            click.echo(ctx.get_help())
            ctx.exit(0)
        first = after_profile(args)  # `xpulaunch -p big train.py` runs train.py too
        if first < len(args) and args[first] not in {*COMMANDS, *self._option_names(ctx)}:
            refuse_mistyped_command(args[first])
            args = [*args[:first], DEFAULT_COMMAND, *args[first:]]
        return super().parse_args(ctx, args)

    def _option_names(self, ctx: click.Context) -> set[str]:
        """The group's own options: --help, -h, --version."""
        return {name for param in self.get_params(ctx) for name in param.opts}


def mistyped_command(word: str) -> str | None:
    """The command ``word`` is close to (``dev`` -> ``devices``), unless ``word`` is an
    option, an existing file or a program on PATH: then it is what the user meant to run."""
    if word.startswith("-"):
        return None
    close = difflib.get_close_matches(word, COMMANDS, n=1)
    if not close or os.path.exists(word) or shutil.which(word) is not None:
        return None
    return close[0]


def refuse_mistyped_command(word: str) -> None:
    """Stop before ``word`` is started as a program when it is probably a mistyped command."""
    command = mistyped_command(word)
    if command is not None:
        raise UsageError(
            f"no command {word!r}; did you mean {command!r}? "
            f"(to run a program of that name: xpulaunch run {word})"
        )


@click.group(cls=DefaultRunGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="xpulaunch")
@click.option(
    "-p",
    "--profile",
    envvar="XPULAUNCH_PROFILE",
    metavar="NAME",
    help="Use the [profiles.NAME] table of the config files (xpulaunch.toml, "
    "[tool.xpulaunch] in pyproject.toml, ~/.config/xpulaunch/config.toml).",
)
@click.pass_context
def cli(ctx: click.Context, profile: str | None) -> None:
    """Launch and supervise multi-GPU jobs and llama.cpp servers.

    \b
    xpulaunch train.py --gpus auto          run a script on the free GPUs
    xpulaunch devices                       list accelerators
    xpulaunch llama -m model.gguf --gpus 2  serve a model pinned to 2 GPUs
    """
    from xpulaunch.cli.config_files import apply_config_files

    apply_config_files(ctx, profile)


def after_profile(args: list[str]) -> int:
    """Index of the first argument after leading ``-p NAME`` / ``--profile[=]NAME``."""
    i = 0
    while i < len(args):
        if args[i] in ("-p", "--profile"):
            i += 2
        elif args[i].startswith("--profile=") or (args[i].startswith("-p") and args[i] != "-p"):
            i += 1
        else:
            break
    return i
