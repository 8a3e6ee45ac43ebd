"""What an operator of a long job asks of ``run``: hangs, a time limit, events, metrics.

:func:`xpulaunch.launch.options.operations_settings` says what the values mean. The lease
events (waited, acquired, released) happen here, before and after the supervisor runs, so
this module writes them to the event stream itself.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

import click

from xpulaunch.cli.options import option_group
from xpulaunch.events import LeaseAcquired, LeaseReleased, LeaseWaited
from xpulaunch.joblog.event_stream import EventStream

if TYPE_CHECKING:
    from collections.abc import Callable

    from xpulaunch.leases import Lease
    from xpulaunch.leases.wait_queue import WaitStatus
    from xpulaunch.model import Plan

operations_options = option_group(
    click.option(
        "--hang-timeout",
        type=float,
        envvar="XPULAUNCH_HANG_TIMEOUT",
        metavar="SECONDS",
        help="A worker that prints nothing (with --heartbeat: does not call "
        "xpulaunch.heartbeat()) for this long is failed: stacks dumped with py-spy when "
        "installed, then the restart policy applies.",
    ),
    click.option(
        "--heartbeat",
        is_flag=True,
        help="With --hang-timeout: watch XPULAUNCH_HEARTBEAT_FILE, touched by "
        "xpulaunch.heartbeat(), instead of the output.",
    ),
    click.option(
        "--max-runtime",
        type=float,
        envvar="XPULAUNCH_MAX_RUNTIME",
        metavar="SECONDS",
        help="Stop the job after this long (exit status 124).",
    ),
    click.option(
        "--events",
        metavar="FILE|-",
        envvar="XPULAUNCH_EVENTS",
        help="Append every supervisor event to FILE as JSON lines (-: standard output, "
        "and the workers' standard output goes to standard error).",
    ),
    click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        envvar="XPULAUNCH_METRICS_PORT",
        metavar="PORT",
        help="Serve Prometheus metrics on http://HOST:PORT/metrics (0: a free port).",
    ),
    click.option(
        "--metrics-host",
        default="127.0.0.1",
        show_default=True,
        envvar="XPULAUNCH_METRICS_HOST",
        help="Address the metrics endpoint listens on.",
    ),
    click.option(
        "--metrics-interval",
        type=float,
        default=10.0,
        show_default=True,
        metavar="SECONDS",
        help="How often device memory and utilisation are probed again for the metrics.",
    ),
)


def open_events(target: str | None) -> EventStream | None:
    """The ``--events`` stream. For ``-``, standard output becomes the events' alone: the
    file descriptor 1 is kept for them and pointed at standard error for everything else
    (the workers' output, which the supervisor writes to this process's stdout)."""
    if target is None:
        return None
    if target != "-":
        return EventStream(target)
    sys.stdout.flush()
    events_fd = os.dup(1)
    os.dup2(2, 1)
    return EventStream.to(os.fdopen(events_fd, "w", encoding="utf-8"))


class LeaseEvents:
    """Writes the lease's events; ``on_wait`` wraps the waiting line's reporter."""

    def __init__(self, stream: EventStream | None, report: Callable[[WaitStatus], None]) -> None:
        self._stream, self._report = stream, report
        self._last: tuple[int, str] | None = None
        self.waited_s = 0.0
        self.acquired: LeaseAcquired | None = None

    def on_wait(self, status: WaitStatus) -> None:
        self._report(status)
        self.waited_s = status.waited_s
        if self._stream is not None and self._last != (status.position, status.reason):
            self._last = (status.position, status.reason)
            self._stream.write(
                LeaseWaited(time.monotonic(), status.waited_s, status.position, status.reason)
            )

    def got(self, plan: Plan, lease: Lease) -> tuple[LeaseAcquired, ...]:
        """The lease is held: its event (also for the metrics' lease wait)."""
        devices = tuple(u.label() for u in plan.devices)
        self.acquired = LeaseAcquired(time.monotonic(), lease.job_id, devices, self.waited_s)
        if self._stream is not None:
            self._stream.write(self.acquired)
        return (self.acquired,)

    def released(self) -> None:
        if self._stream is not None and self.acquired is not None:
            acquired = self.acquired
            self._stream.write(LeaseReleased(time.monotonic(), acquired.job_id, acquired.devices))


llama_metrics_options = option_group(
    click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        envvar="XPULAUNCH_METRICS_PORT",
        metavar="PORT",
        help="Serve Prometheus metrics on http://HOST:PORT/metrics: the supervisor's, and "
        "each replica's own (llama-server --metrics) labelled with model and replica.",
    ),
    click.option(
        "--metrics-host",
        default="127.0.0.1",
        show_default=True,
        envvar="XPULAUNCH_METRICS_HOST",
        help="Address the metrics endpoint listens on.",
    ),
)
