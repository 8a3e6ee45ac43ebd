"""``xpulaunch [OPTIONS] PROGRAM [ARGS]``: who owns which argument.

The contract wants ``xpulaunch train.py --gpus auto`` to work *and* arguments after PROGRAM to
reach PROGRAM. Both hold with one rule: xpulaunch's own option names are recognised anywhere
before ``--``; every other argument after PROGRAM, and everything after ``--``, belongs to
PROGRAM. A program option that shares a name with ours goes after ``--``.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

_NEVER_HOISTED = {"--help", "-h"}


class ProgramCommand(click.Command):
    """A command whose trailing ``program`` argument collects PROGRAM and its arguments."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ours, program = split_args(args, self._option_arity())
        return super().parse_args(ctx, [*ours, "--", *program] if program else ours)

    def _option_arity(self) -> dict[str, int]:
        arity: dict[str, int] = {}
        for param in self.params:
            if isinstance(param, click.Option):
                takes = 0 if param.is_flag or param.count else param.nargs
                for name in (*param.opts, *param.secondary_opts):
                    arity[name] = takes
        return arity


def split_args(args: Sequence[str], arity: dict[str, int]) -> tuple[list[str], list[str]]:
    """Split argv into (our options, PROGRAM and its arguments).

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
        hoist = name in arity and not (program and name in _NEVER_HOISTED)
        if hoist:
            takes = 0 if "=" in arg else arity[name]
            ours.extend(args[i : i + 1 + takes])
            i += 1 + takes
            continue
        if not program and arg.startswith("-") and arg != "-":
            ours.append(arg)  # an unknown option before PROGRAM: let click report it
        else:
            program.append(arg)
        i += 1
    return ours, program
