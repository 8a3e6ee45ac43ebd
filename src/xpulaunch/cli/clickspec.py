"""click commands and options built from the tables of :mod:`xpulaunch.cli.spec`.

This is the slow, complete path: help, error messages, and the commands without a fast path
(``llama``, ``status``). It imports click; :mod:`xpulaunch.cli.spec` must not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from xpulaunch.cli.spec import (
    CHOICE,
    DIR,
    FILE,
    FLAG,
    FLOAT,
    INT,
    SWITCH,
    CommandSpec,
    Opt,
    split_args,
)

F = TypeVar("F", bound=Callable[..., Any])
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


def click_type(opt: Opt) -> click.ParamType[Any] | None:
    """The click type that converts ``opt``'s value as :func:`xpulaunch.cli.spec.parse` does
    (None: a flag, or click's default string type)."""
    ranged = opt.low is not None or opt.high is not None
    if opt.kind == INT and ranged:
        return click.IntRange(_int(opt.low), _int(opt.high))
    if opt.kind == FLOAT and ranged:
        return click.FloatRange(opt.low, opt.high)
    if opt.kind == CHOICE:
        return click.Choice(opt.choices)
    if opt.kind in (DIR, FILE):
        return click.Path(file_okay=opt.kind == FILE, dir_okay=opt.kind == DIR)
    simple: dict[str, click.ParamType[Any]] = {INT: click.INT, FLOAT: click.FLOAT}
    return simple.get(opt.kind)


def _int(bound: float | None) -> int | None:
    return None if bound is None else int(bound)


def click_param(opt: Opt) -> click.Option:
    """The click option declared by ``opt``."""
    names = list(opt.names)
    if opt.kind == SWITCH:
        names = [f"{on}/{off}" for on, off in zip(opt.names, opt.off_names, strict=True)]
    kwargs: dict[str, Any] = {"help": opt.help, "show_default": opt.show_default}
    if opt.kind == FLAG:
        kwargs["is_flag"] = True
    else:
        kwargs.update(type=click_type(opt), default=opt.default, metavar=opt.metavar)
    if opt.envvar is not None:
        kwargs.update(envvar=opt.envvar, show_envvar=opt.show_envvar)
    return click.Option([*names, opt.dest], **kwargs)


def options(opts: Sequence[Opt]) -> Callable[[F], F]:
    """A decorator adding ``opts`` to a click command function, in table order (for commands
    declared with click decorators, such as ``llama``)."""

    def decorate(func: F) -> F:
        params: list[click.Parameter] = func.__dict__.setdefault("__click_params__", [])
        # click reverses the decorators' list when it builds the command.
        params.extend(click_param(opt) for opt in reversed(opts))
        return func

    return decorate


class ProgramCommand(click.Command):
    """A command whose trailing ``program`` argument collects PROGRAM and its arguments."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        arity = self._option_arity()
        ours, program = split_args(args, arity)
        if program and not _lacks_value(ours, arity):
            ours = [*ours, "--", *program]
        # else: click reports the missing PROGRAM, or the option missing its value (with
        # "--" appended, click would take "--" as that value).
        return super().parse_args(ctx, ours)

    def _option_arity(self) -> dict[str, int]:
        arity: dict[str, int] = {}
        for param in self.params:
            if isinstance(param, click.Option):
                takes = 0 if param.is_flag or param.count else param.nargs
                for name in (*param.opts, *param.secondary_opts):
                    arity[name] = takes
        return arity


def _lacks_value(ours: list[str], arity: dict[str, int]) -> bool:
    """Whether the last of ``ours`` is an option that takes a value but has none."""
    i = 0
    while i < len(ours):
        takes = 0 if "=" in ours[i] else arity.get(ours[i], 0)
        if i + takes >= len(ours):
            return takes > 0
        i += 1 + takes
    return False


def command(spec: CommandSpec) -> click.Command:
    """The click command for ``spec``; it calls ``spec.function`` with the parsed values."""

    def callback(**values: Any) -> int | None:
        return spec.function(**values)

    params: list[click.Parameter] = [click_param(opt) for opt in spec.options]
    if spec.program:
        params.append(click.Argument(["program"], nargs=-1, required=True, type=click.UNPROCESSED))
    cls = ProgramCommand if spec.program else click.Command
    return cls(
        spec.name,
        callback=callback,
        params=params,
        help=spec.doc,
        context_settings=CONTEXT_SETTINGS,
    )
