"""Who owns which word of the command line: the ``xpulaunch`` group (its commands, and ``run``
as the command of a first word that is none: ``xpulaunch train.py --gpus auto``), and in
``xpulaunch [run] [OPTIONS] PROGRAM [ARGS]...`` our options or PROGRAM's.

The contract wants ``xpulaunch train.py --gpus auto`` to work *and* arguments after PROGRAM to
reach PROGRAM: xpulaunch's option names are recognised anywhere before ``--``; every other
argument after PROGRAM, and everything after ``--``, belongs to PROGRAM (:class:`ProgramCommand`).
A program option that shares a name with ours goes after ``--``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import click

from xpulaunch import __version__
from xpulaunch.cli.commands import COMMANDS, CONTEXT_SETTINGS, SUMMARIES, load_command
from xpulaunch.errors import UsageError

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

DEFAULT_COMMAND = "run"


class DefaultRunGroup(click.Group):
    """A group whose unknown first word means ``run``, unless it looks like a mistyped command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """Command names from :data:`COMMANDS` (importing none of them); the group's options
        for ``-...``; else a file: ``xpulaunch tra<TAB>`` is a script to run."""
        from click.shell_completion import CompletionItem

        if incomplete.startswith("-"):
            return super().shell_complete(ctx, incomplete)
        names = [n for n in sorted(COMMANDS) if n.startswith(incomplete)]
        if names:
            return [CompletionItem(n, help=SUMMARIES.get(n)) for n in names]
        return [CompletionItem(incomplete, type="file")]

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
        if not args and not ctx.resilient_parsing:  # (resilient: completing the first word)
            # the whole help, as `--help` shows it, rather than a usage error
            click.echo(ctx.get_help())
            ctx.exit(0)
        first = after_profile(args)  # `xpulaunch -p big train.py` runs train.py too
        if first < len(args) and args[first] not in {*COMMANDS, *self._option_names(ctx)}:
            if not ctx.resilient_parsing:  # completion: a word being typed is no mistake yet
                refuse_mistyped_command(args[first])
            args = [*args[:first], DEFAULT_COMMAND, *args[first:]]
        return super().parse_args(ctx, args)

    def _option_names(self, ctx: click.Context) -> set[str]:
        """The group's own options: --help, -h, --version."""
        return {name for param in self.get_params(ctx) for name in param.opts}


def mistyped_command(word: str) -> str | None:
    """The command ``word`` is close to (``dev`` -> ``devices``), unless ``word`` is an
    option, an existing file or a program on PATH: then it is what the user meant to run."""
    import difflib
    import shutil

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


_HELP_NAMES = ("-h", "--help")
AFTER_DASHDASH = "xpulaunch.program_args_after_dashdash"


def split_args(args: Sequence[str], arity: Mapping[str, int]) -> tuple[list[str], list[str]]:
    """Split argv into (our options, PROGRAM and its arguments); ``arity`` maps each of our
    option names to how many arguments follow it.

    >>> split_args(["train.py", "--gpus", "2", "--lr", "1"], {"--gpus": 1})
    (['--gpus', '2'], ['train.py', '--lr', '1'])
    """
    ours: list[str] = []
    program: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            program.extend(args[i + 1 :])
            break
        name = arg.split("=", 1)[0]
        if name in arity and not (program and name in _HELP_NAMES):
            takes = 0 if "=" in arg else arity[name]
            ours.extend(args[i : i + 1 + takes])
            i += 1 + takes
            continue
        if not program and arg.startswith("-") and arg != "-":
            ours.append(arg)  # an unknown option before PROGRAM: click reports it
        else:
            program.append(arg)
        i += 1
    return ours, program


class ProgramCommand(click.Command):
    """A command whose trailing ``program`` argument collects PROGRAM and its arguments."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        arity = option_arity(self)
        ours, program = split_args(args, arity)
        # How many of PROGRAM's arguments the user put after "--" (meant for PROGRAM for sure).
        ctx.meta[AFTER_DASHDASH] = len(args) - args.index("--") - 1 if "--" in args else 0
        if program and not _lacks_value(ours, arity):
            ours = [*ours, "--", *program]
        # else: click reports the missing PROGRAM, or the option missing its value (with
        # "--" appended, click would take "--" as that value).
        return super().parse_args(ctx, ours)


def option_arity(command: click.Command) -> dict[str, int]:
    """``command``'s option names -> how many values each takes (0 for flags)."""
    arity: dict[str, int] = {}
    for param in command.params:
        if isinstance(param, click.Option):
            takes = 0 if param.is_flag or param.count else param.nargs
            for name in (*param.opts, *param.secondary_opts):
                arity[name] = takes
    return arity


def _lacks_value(ours: list[str], arity: Mapping[str, int]) -> bool:
    """Whether the last of ``ours`` is an option that takes a value but has none."""
    i = 0
    while i < len(ours):
        takes = 0 if "=" in ours[i] else arity.get(ours[i], 0)
        if i + takes >= len(ours):
            return takes > 0
        i += 1 + takes
    return False
