"""``--lock-dir``, ``--shared``, ``--wait``, ``--wait-timeout``: device reservations for ``run``
and ``llama``, the manager built from them, and the live "waiting" line.

Wiring, in a command decorated with :func:`lease_options`::

    settings = LeaseSettings.pop_from(options)          # removes the four keys
    with WaitReporter() as reporter:
        plan, lease = settings.allocate(lambda unavailable: make_the_plan(unavailable),
                                        on_wait=reporter)
    # pass lease.fds to every worker (pass_fds) and to the guardian; lease.release() at the end

A dry run reserves nothing: ``settings.manager().unavailable()`` gives the mapping to plan with.
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from xpulaunch.cli.bounds import SECONDS
from xpulaunch.cli.options import option_group
from xpulaunch.cli.terminal import terminal_safe

if TYPE_CHECKING:
    from collections.abc import Callable, MutableMapping, Sequence
    from typing import Any, TextIO

    from xpulaunch.leases import Lease, LeaseManager, PlanFn, WaitStatus
    from xpulaunch.model import DeviceShare, Plan

lock_dir_option = click.option(
    "--lock-dir",
    type=click.Path(file_okay=False),
    envvar="XPULAUNCH_LOCK_DIR",
    metavar="DIR",
    help="Lock directory shared by every user of this machine (its files are readable and "
    "writable by all). Default: a private one, $XDG_RUNTIME_DIR/xpulaunch or "
    "/tmp/xpulaunch-UID. Containers that share GPUs need a shared one "
    "[env: XPULAUNCH_LOCK_DIR].",
)

lease_options = option_group(
    lock_dir_option,
    click.option(
        "--shared",
        is_flag=True,
        help="Use devices named in --gpus even when another job has leased them, and lease "
        "nothing: other jobs may then get these devices too.",
    ),
    click.option(
        "--wait",
        is_flag=True,
        help="When the devices are leased by other jobs, queue until they are free (first "
        "come, first served) instead of failing.",
    ),
    click.option(
        "--wait-timeout",
        type=SECONDS,
        metavar="SECONDS",
        help="Give up waiting after SECONDS (implies --wait).",
    ),
)
_KEYS = ("lock_dir", "shared", "wait", "wait_timeout")


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """The values of the reservation options."""

    lock_dir: str | None = None
    shared: bool = False
    wait: bool = False
    wait_timeout_s: float | None = None

    @classmethod
    def pop_from(cls, options: MutableMapping[str, Any]) -> LeaseSettings:
        """Take the four options out of a command's keyword arguments."""
        lock_dir, shared, wait, timeout_s = (options.pop(key, None) for key in _KEYS)
        return cls(
            lock_dir=_path(lock_dir),
            shared=bool(shared),
            wait=bool(wait) or timeout_s is not None,
            wait_timeout_s=None if timeout_s is None else float(timeout_s),
        )

    def manager(self) -> LeaseManager:
        from xpulaunch.leases import LeaseManager

        return LeaseManager(self.lock_dir)

    def allocate(
        self,
        plan_fn: PlanFn,
        *,
        on_wait: Callable[[WaitStatus], None] | None = None,
        command: Sequence[str] | None = None,
        manager: LeaseManager | None = None,
        share: DeviceShare | None = None,
    ) -> tuple[Plan, Lease]:
        """Plan and lease atomically, waiting in line when asked to; with ``share``, a slot
        of each device (``--slots-per-gpu``, ``--gpu-memory``)."""
        return (manager or self.manager()).allocate(
            plan_fn,
            shared=self.shared,
            wait=self.wait,
            wait_timeout_s=self.wait_timeout_s,
            on_wait=on_wait,
            command=command,
            share=share,
        )


def wait_line(status: WaitStatus) -> str:
    """``waiting 12 s for devices (next in line): --gpus 1: only 0 free device(s) ...``"""
    place = "next in line" if status.position == 1 else f"{_ordinal(status.position)} in line"
    limit = "" if status.timeout_s is None else f" of {status.timeout_s:g}"
    return f"waiting {status.waited_s:.0f} s{limit} for devices ({place}): {status.reason}"


class WaitReporter:
    """``on_wait`` callback: one live line on a terminal, occasional lines in a log."""

    def __init__(self, stream: TextIO | None = None, *, log_every_s: float = 30.0) -> None:
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._log_every_s = log_every_s
        self._last: tuple[int, str, float] | None = None  # position, reason, waited_s
        self._open_line = False
        self._ignored_sigint = False

    def __call__(self, status: WaitStatus) -> None:
        line = "xpulaunch: " + terminal_safe(wait_line(status))  # names other users' commands
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


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _path(value: object) -> str | None:
    return str(value) if value else None
