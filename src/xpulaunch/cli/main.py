"""Entry point: one ``main()`` that turns every XpulaunchError into one line and an exit code.

Two ways through, one result. A well-formed ``run`` (the default command) or ``devices``
command line is parsed by :func:`xpulaunch.cli.spec.parse` and runs without importing click,
which alone costs ~35 ms of the 60 ms that ``xpulaunch train.py`` may add (issue 4). Anything
else (other commands, ``--help``, ``--version``, a mistake) goes through the click group
below, built from the same option tables, so help and error messages are click's.

Subcommands are imported lazily so that ``xpulaunch run --dry-run`` loads only what it needs
(the probe, psutil and the supervisor stay out of a dry run with ``--inventory``).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

from xpulaunch.errors import XpulaunchError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


# name -> "module:attribute": a CommandSpec (fast path and click) or a click command.
COMMANDS = {
    "run": "xpulaunch.cli.run:RUN",
    "devices": "xpulaunch.cli.devices:DEVICES",
    "llama": "xpulaunch.cli.llama:llama",
    "status": "xpulaunch.cli.status:status",
}
DEFAULT_COMMAND = "run"
GROUP_FLAGS = frozenset({"--help", "-h", "--version"})


def load_command(name: str) -> object:
    module_name, attr = COMMANDS[name].split(":")
    return getattr(importlib.import_module(module_name), attr)


def command_line(args: Sequence[str]) -> tuple[str, list[str]] | None:
    """(command name, its arguments), with ``run`` for a first word that is no command;
    None for an empty command line or a group flag (click shows help or the version)."""
    if not args or args[0] in GROUP_FLAGS:
        return None
    if args[0] in COMMANDS:
        return args[0], list(args[1:])
    return DEFAULT_COMMAND, list(args)


def fast_call(args: Sequence[str]) -> Callable[[], int | None] | None:
    """The command to run for ``args`` without click, or None when click must parse them."""
    from xpulaunch.cli.spec import CommandSpec, parse

    found = command_line(args)
    if found is None:
        return None
    spec = load_command(found[0])
    if not isinstance(spec, CommandSpec):
        return None  # declared with click decorators (llama, status)
    values = parse(spec, found[1], os.environ)
    if values is None:
        return None
    return lambda: spec.function(**values)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI; exit (SystemExit) with the command's status."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("XPULAUNCH_DEBUG") == "1"
    try:
        call = fast_call(args)
        status = call() if call is not None else _click_main(args, debug)
    except XpulaunchError as exc:
        if debug:
            raise
        _fail(exc.cli_message(), exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except BrokenPipeError:
        _reader_gone()
    sys.exit(status if isinstance(status, int) else 0)


def _reader_gone() -> None:
    """Our output's reader went away (``xpulaunch devices | head -1``): stop quietly, as a
    program killed by SIGPIPE would (128 + 13), without a traceback. stdout goes to /dev/null
    first, so that flushing it on the way out cannot fail again (Python's signal docs)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(128 + 13)


def console_main() -> None:
    """The ``xpulaunch`` executable and ``python -m xpulaunch``: :func:`main`, then a fast exit.

    Leaving through ``os._exit`` skips the interpreter's teardown (~10 ms of module and thread
    clean-up on the dev VM) that a finished command does not need: every file we wrote is
    closed by then, the supervisor has reaped its workers, and we register no atexit hook.
    """
    try:
        main()
    except SystemExit as exc:
        code = exc.code
        if code is not None and not isinstance(code, int):
            sys.stderr.write(f"{code}\n")
            code = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a reader that went away (`| head`), a closed stream
                code = code or 1
        os._exit(code or 0)


def _click_main(args: list[str], debug: bool) -> int | None:
    import click

    from xpulaunch.cli.clickgroup import cli

    try:
        status = cli.main(args=args, prog_name="xpulaunch", standalone_mode=False)
    except click.exceptions.Abort:
        _fail("interrupted", 130)
    except click.ClickException as exc:
        if debug:
            raise
        ctx = getattr(exc, "ctx", None)
        hint = "" if ctx is None else f" (see '{ctx.command_path} --help')"
        _fail(exc.format_message() + hint, exc.exit_code)
    return status if isinstance(status, int) else None


def _fail(message: str, code: int) -> None:
    one_line = " ".join(message.split())
    sys.stderr.write(f"xpulaunch: error: {one_line}\n")
    sys.exit(code)
