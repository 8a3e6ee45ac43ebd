"""A launch waiting in line for devices: the live "waiting" line (:class:`WaitReporter`),
which is also where a run's one-line messages go before its workers speak; and the
``--lock-dir`` option of the commands that only read the leases."""

from __future__ import annotations

import shutil
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from typing import TextIO

    from xpulaunch.leases.wait_queue import WaitStatus

# --lock-dir, as run's options and the commands that only read the leases declare it.
LOCK_DIR: dict[str, Any] = {
    "type": click.Path(file_okay=False),
    "envvar": "XPULAUNCH_LOCK_DIR",
    "metavar": "DIR",
    "help": "Lock directory shared by every user of this machine (its files are readable and "
    "writable by all). Default: a private one, $XDG_RUNTIME_DIR/xpulaunch or "
    "/tmp/xpulaunch-UID. Containers that share GPUs need a shared one.",
}
lock_dir_option = click.option("--lock-dir", **LOCK_DIR)


class WaitReporter:
    """``on_wait``: one live line on a terminal, occasional lines in a log; ``say``: a line of
    the run's own (the live line is cleared first)."""

    def __init__(self, stream: TextIO | None = None, *, log_every_s: float = 30.0) -> None:
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._log_every_s = log_every_s
        self._last: tuple[int, str, float] | None = None  # position, reason, waited_s
        self._open_line = False
        self._ignored_sigint = False

    def say(self, text: str) -> None:
        self.close()
        self._stream.write(f"xpulaunch: {text}\n")
        self._stream.flush()

    def on_wait(self, status: WaitStatus) -> None:
        from xpulaunch.cli.terminal import one_line  # only a launch that waits gets here
        from xpulaunch.leases.wait_queue import wait_line

        # It names other users' commands; one line, so that \r rewrites all of it.
        line = "xpulaunch: " + one_line(wait_line(status))
        if self._tty:
            width = shutil.get_terminal_size().columns - 1
            self._stream.write("\r\x1b[K" + line[:width])
            self._open_line = True
        elif self._due(status):
            self._stream.write(line + "\n")
            self._last = (status.position, status.reason, status.waited_s)
        self._stream.flush()

    def _due(self, status: WaitStatus) -> bool:
        if self._last is None:
            return True
        position, reason, waited_s = self._last
        changed = (position, reason) != (status.position, status.reason)
        return changed or status.waited_s - waited_s >= self._log_every_s

    def close(self) -> None:
        if self._open_line:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._open_line = False

    def __enter__(self) -> WaitReporter:
        self._ignored_sigint = _honour_sigint()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
        if self._ignored_sigint:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _honour_sigint() -> bool:
    """Make SIGINT stop a waiting launch even when it was ignored at start (``nohup``, a
    background job of a script): the run phase's handler stops the job on it whatever the
    inherited disposition, so waiting must not be the one phase deaf to it. True when it was
    ignored (and is restored afterwards)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return True
