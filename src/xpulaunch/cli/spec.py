"""Command-line options declared once, as data, and a click-free parser for the hot path.

Why (issue 4): ``xpulaunch train.py`` may add at most 60 ms to starting ``train.py``, and
importing click alone takes ~35 ms on the 2-core dev VM. So the options of ``run`` and
``devices`` are declared here as :class:`Opt` tables, read by two parsers:

* click builds its commands from them (:mod:`xpulaunch.cli.clickspec`): ``--help``, every
  error message, ``llama`` and ``status``;
* :func:`parse` reads the same tables without importing click, for the well-formed command
  lines people type every time. On anything else (``--help``, an unknown option, a missing
  or invalid value, a file where a directory is wanted) it returns None and the caller goes
  through click, so the messages stay click's. A property test holds the two parsers to the
  same values on every command line this one accepts (tests/cli/test_spec.py).

Who owns which argument (the contract wants ``xpulaunch train.py --gpus auto`` to work *and*
arguments after PROGRAM to reach PROGRAM): xpulaunch's option names are recognised anywhere
before ``--``; every other argument after PROGRAM, and everything after ``--``, belongs to
PROGRAM. A program option that shares a name with ours goes after ``--``.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

# Kinds of option value, each converted the way the matching click type converts it.
TEXT = "text"  # click.STRING
INT = "int"  # click.INT, or click.IntRange(low, high) when a bound is given
FLOAT = "float"  # click.FLOAT, or click.FloatRange(low, high)
CHOICE = "choice"  # click.Choice(choices), case-sensitive
DIR = "dir"  # click.Path(file_okay=False): an existing path must be a readable directory
FILE = "file"  # click.Path(dir_okay=False): an existing path must be a readable non-directory
FLAG = "flag"  # is_flag: True when given
SWITCH = "switch"  # --name/--no-name: True, False, or the default (None) when neither is given

_VALUE_KINDS = frozenset({TEXT, INT, FLOAT, CHOICE, DIR, FILE})
_HELP_NAMES = ("-h", "--help")


class Opt:
    """One option: its names, where its value goes (``dest``), and how it is read."""

    __slots__ = (
        "choices",
        "default",
        "dest",
        "envvar",
        "help",
        "high",
        "kind",
        "low",
        "metavar",
        "names",
        "off_names",
        "show_default",
        "show_envvar",
    )

    def __init__(
        self,
        *names: str,
        dest: str,
        kind: str = TEXT,
        default: object = None,
        envvar: str | None = None,
        metavar: str | None = None,
        help: str = "",
        show_default: bool = False,
        show_envvar: bool = False,
        choices: tuple[str, ...] = (),
        low: float | None = None,
        high: float | None = None,
        off_names: tuple[str, ...] = (),
    ) -> None:
        if kind not in _VALUE_KINDS | {FLAG, SWITCH}:
            raise ValueError(f"option {names}: unknown kind {kind!r}")
        if kind in (FLAG, SWITCH) and envvar is not None:
            # click reads a flag's variable with its own truthiness rules; none of ours has one.
            raise ValueError(f"option {names}: an environment variable for a flag is not supported")
        if (kind == SWITCH) != bool(off_names):
            raise ValueError(f"option {names}: off_names go with kind SWITCH, and only with it")
        self.names, self.dest, self.kind, self.default = names, dest, kind, default
        self.envvar, self.metavar, self.help = envvar, metavar, help
        self.show_default, self.show_envvar = show_default, show_envvar
        self.choices, self.low, self.high, self.off_names = choices, low, high, off_names

    @property
    def takes_value(self) -> bool:
        return self.kind in _VALUE_KINDS

    def __repr__(self) -> str:
        return f"Opt({self.names[0]!r}, dest={self.dest!r}, kind={self.kind!r})"


class CommandSpec:
    """A command: its options, whether it takes ``PROGRAM [ARGS]...`` (passed to ``function``
    as ``program``, a tuple), its help text, and the click-free function that does the work
    (it gets one keyword argument per option ``dest``)."""

    __slots__ = ("doc", "function", "name", "options", "program")

    def __init__(
        self,
        name: str,
        options: Sequence[Opt],
        function: Callable[..., int | None],
        doc: str,
        *,
        program: bool = False,
    ) -> None:
        self.name, self.options, self.function = name, tuple(options), function
        self.doc, self.program = doc, program

    def arity(self) -> dict[str, int]:
        """Option name -> how many arguments follow it (0 for flags and switches)."""
        return {
            name: int(opt.takes_value) for opt in self.options for name in opt.names + opt.off_names
        }


def split_args(args: Sequence[str], arity: Mapping[str, int]) -> tuple[list[str], list[str]]:
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
        hoist = name in arity and not (program and name in _HELP_NAMES)
        if hoist:
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


class _Invalid(Exception):
    """A command line the fast parser leaves to click (which explains what is wrong)."""


def parse(
    spec: CommandSpec, args: Sequence[str], environ: Mapping[str, str]
) -> dict[str, object] | None:
    """The keyword arguments of ``spec.function`` for ``args``, as click would give them, or
    None when click must handle the command line (help, an error, anything unusual)."""
    if spec.program:
        ours, program = split_args(args, spec.arity())
        if not program:
            return None  # click: "Missing argument 'PROGRAM...'"
    else:
        ours, program = list(args), []
    try:
        values = _parse_options(spec.options, ours, environ)
    except _Invalid:
        return None
    if spec.program:
        values["program"] = tuple(program)
    return values


def _parse_options(
    options: Sequence[Opt], args: Sequence[str], environ: Mapping[str, str]
) -> dict[str, object]:
    by_name = {name: (opt, True) for opt in options for name in opt.names}
    by_name.update({name: (opt, False) for opt in options for name in opt.off_names})
    given: dict[str, object] = {}
    i = 0
    while i < len(args):
        name, has_value, value = args[i].partition("=")
        if name not in by_name:
            raise _Invalid  # --help, -h, --version, an unknown or abbreviated option
        opt, on = by_name[name]
        if not opt.takes_value:
            if has_value:
                raise _Invalid  # click: "Option '--x' does not take a value."
            given[opt.dest] = on
        else:
            if not has_value:
                i += 1
                if i == len(args):
                    raise _Invalid  # click: "Option '--x' requires an argument."
                value = args[i]
            given[opt.dest] = _convert(opt, value)
        i += 1
    return {opt.dest: _value(opt, given, environ) for opt in options}


def _value(opt: Opt, given: Mapping[str, object], environ: Mapping[str, str]) -> object:
    if opt.dest in given:
        return given[opt.dest]
    from_env = environ.get(opt.envvar) if opt.envvar else None
    if from_env:  # click ignores a variable that is set but empty
        return _convert(opt, from_env)
    if opt.kind == FLAG:
        return bool(opt.default)
    return opt.default


def _convert(opt: Opt, text: str) -> object:
    kind = opt.kind
    if kind == TEXT:
        return text
    if kind == CHOICE:
        if text not in opt.choices:
            raise _Invalid
        return text
    if kind in (INT, FLOAT):
        return _number(opt, text)
    _check_path(text, want_dir=kind == DIR)
    return text


def _number(opt: Opt, text: str) -> float:
    try:
        number: float = int(text) if opt.kind == INT else float(text)
    except ValueError:
        raise _Invalid from None
    # The same comparisons as click's closed ranges (so NaN passes a FloatRange, as there).
    if (opt.low is not None and number < opt.low) or (opt.high is not None and number > opt.high):
        raise _Invalid
    return number


def _check_path(path: str, *, want_dir: bool) -> None:
    """click.Path(exists=False): a missing path is fine; an existing one must be readable and
    of the right type."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) if want_dir else stat.S_ISDIR(mode):
        raise _Invalid
    if not os.access(path, os.R_OK):
        raise _Invalid
