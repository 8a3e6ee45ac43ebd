"""Entry point: one ``main()`` that turns every error into one line on stderr and an exit code.

Errors a user can cause are :class:`~xpulaunch.errors.XpulaunchError` (raised by the commands)
or click's usage errors (raised while parsing); both become ``xpulaunch: error: ...``, with no
traceback unless ``XPULAUNCH_DEBUG=1``.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from xpulaunch.cli.commands import COMPLETE_VAR
from xpulaunch.cli.group import cli
from xpulaunch.errors import XpulaunchError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

_SIGPIPE_STATUS = 128 + 13  # what a shell reports for a program killed by SIGPIPE


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI; exit (SystemExit) with the command's status."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("XPULAUNCH_DEBUG") == "1"
    try:
        status = _invoke(args)
    except click.exceptions.Exit as exc:  # --help, --version
        status = exc.exit_code
    except (click.ClickException, XpulaunchError) as exc:
        if debug:
            raise
        _fail(_error_line(exc), exc.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort):
        _fail("interrupted", 130)
    except BrokenPipeError:
        _reader_gone()
    except OSError as exc:
        # What the system refused where no check foresaw it (a folder closed to us, a name
        # too long): one line, as for other bad input. Whatever was started is stopped and
        # released by then (every launch holds its workers and leases in context managers).
        if debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        _fail(f"{where}{exc.strerror or exc} (XPULAUNCH_DEBUG=1 shows where)", 1)
    sys.exit(status if isinstance(status, int) else 0)


def _invoke(args: list[str]) -> object:
    """Parse and run one command line. Not ``cli.main``: that turns a closed pipe into exit
    status 1, and prints errors in click's own several-line form. Its completion hook is
    honoured here instead (``_XPULAUNCH_COMPLETE``, as ``cli.main`` would)."""
    instruction = os.environ.get(COMPLETE_VAR)
    if instruction:  # the shell's completion script calling back (click's own protocol)
        from xpulaunch.cli.completion import complete

        return complete(instruction)
    with cli.make_context("xpulaunch", args) as ctx:
        return cli.invoke(ctx)


def _error_line(exc: click.ClickException | XpulaunchError) -> str:
    if isinstance(exc, XpulaunchError):
        return exc.cli_message()
    ctx = getattr(exc, "ctx", None)  # usage errors know their command
    if isinstance(exc, click.BadParameter) and exc.param is not None and exc.message:
        # What the user wrote: the variable the value came from, or the option's first name
        # (not click's "Invalid value for ... (env var: ...)").
        hint = _variable(exc) or (exc.param.opts[0] if exc.param.opts else exc.param.name)
        return f"{hint}: {exc.message}" + _help_hint(ctx)
    return exc.format_message() + _help_hint(ctx)


def _help_hint(ctx: click.Context | None) -> str:
    return "" if ctx is None else f" (see '{ctx.command_path} --help')"


def _variable(exc: click.BadParameter) -> str | None:
    """The environment variable a bad value came from (``XPULAUNCH_GRACE``), so that the
    message names what the user set, not an option they never typed."""
    ctx, param = exc.ctx, exc.param
    if ctx is None or param is None or param.name is None:
        return None
    if ctx.get_parameter_source(param.name) is not click.core.ParameterSource.ENVIRONMENT:
        return None
    names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
    return next((name for name in names if os.environ.get(name)), None)


MAX_ERROR_CHARS = 1000  # an error may quote the input, and inputs can be huge


def _fail(message: str, code: int) -> None:
    one_line = " ".join(message.split())
    if len(one_line) > MAX_ERROR_CHARS:
        more = len(one_line) - MAX_ERROR_CHARS
        one_line = f"{one_line[:MAX_ERROR_CHARS]}... ({more} more characters)"
    sys.stderr.write(f"xpulaunch: error: {one_line}\n")
    sys.exit(code)


def _reader_gone() -> None:
    """Our output's reader went away (``xpulaunch devices | head -1``): stop quietly, as a
    program killed by SIGPIPE would, without a traceback. stdout goes to /dev/null first, so
    that flushing it on the way out cannot fail again (Python's signal docs, "Note on
    SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(_SIGPIPE_STATUS)


def console_main() -> None:
    """The ``xpulaunch`` executable and ``python -m xpulaunch``: :func:`main`, then a quick exit.

    Leaving through ``os._exit`` skips the interpreter's teardown (module and thread clean-up)
    that a finished command does not need: every file we wrote is closed by then, the
    supervisor has reaped its workers, and we register no atexit hook. The streams are
    flushed by hand first, since ``os._exit`` would not.
    """
    _closed_streams_to_devnull()
    _stderr_that_never_fails()
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


def _closed_streams_to_devnull() -> None:
    """A closed stdin, stdout or stderr (``>&-``, ``2>&-``: how some daemons and cron set-ups
    start programs) is treated like ``/dev/null``. Python starts with ``sys.stdout`` None
    then, and the first file xpulaunch opened would get descriptor 1 and receive what was
    meant for stdout; so the descriptor is opened on /dev/null before anything else."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: fd itself
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        stream = open(fd, mode, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
        setattr(sys, name, stream)


class _Dropping(io.RawIOBase):
    """Descriptor 2 for xpulaunch's own messages: what cannot be written there (a stderr on a
    full disk, ``2>/dev/full``, an I/O error) is dropped, as for a closed stderr. A message
    of ours that cannot be shown must not stop the job or change its exit status."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: ReadableBuffer) -> int:
        view = memoryview(data)
        try:
            return os.write(self._fd, view)
        except OSError:  # also EAGAIN on a stderr someone made non-blocking: never wait
            return view.nbytes


def _stderr_that_never_fails() -> None:
    """``sys.stderr`` over :class:`_Dropping` (same encoding and error handler, line by line),
    so that every writer of xpulaunch's messages (click, ``_fail``, warnings) shares it."""
    old = sys.stderr
    if old is None:
        return
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(_Dropping(2)),
        encoding=getattr(old, "encoding", None) or "utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=getattr(old, "write_through", False),
    )
