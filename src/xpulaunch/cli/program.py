"""Who owns which argument of ``xpulaunch [run] [OPTIONS] PROGRAM [ARGS]...``.

The contract wants ``xpulaunch train.py --gpus auto`` to work *and* arguments after PROGRAM to
reach PROGRAM: xpulaunch's option names are recognised anywhere before ``--``; every other
argument after PROGRAM, and everything after ``--``, belongs to PROGRAM. A program option that
shares a name with ours goes after ``--``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import click

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
        arity = self._option_arity()
        ours, program = split_args(args, arity)
        # How many of PROGRAM's arguments the user put after "--" (meant for PROGRAM for sure).
        ctx.meta[AFTER_DASHDASH] = len(args) - args.index("--") - 1 if "--" in args else 0
        if program and not _lacks_value(ours, arity):
            ours = [*ours, "--", *program]
        # else: click reports the missing PROGRAM, or the option missing its value (with
        # "--" appended, click would take "--" as that value).
        return super().parse_args(ctx, ours)

    def _option_arity(self) -> dict[str, int]:
        return option_arity(self)


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
