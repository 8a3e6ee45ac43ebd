"""What a run offers an operator besides its console: the event stream (``--events``),
``summary.json`` (with ``--log-dir``) and the metrics endpoint (``--metrics-port``); and the
lease's own events, which happen before and after the supervisor runs."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

from xpulaunch.events import LeaseAcquired, LeaseReleased, LeaseWaited

if TYPE_CHECKING:
    from collections.abc import Callable

    from xpulaunch.events import Event
    from xpulaunch.joblog.event_stream import EventStream
    from xpulaunch.joblog.metrics import MetricsServer
    from xpulaunch.joblog.run_summary import RunSummary
    from xpulaunch.launch.request import RunRequest
    from xpulaunch.leases.manager import Lease
    from xpulaunch.leases.wait_queue import WaitStatus
    from xpulaunch.model import Plan
    from xpulaunch.supervisor.supervisor import Supervisor


def open_events(target: str | None) -> EventStream | None:
    """The ``--events`` stream. For ``-``, standard output becomes the events' alone: the
    file descriptor 1 is kept for them and pointed at standard error for everything else
    (the workers' output, which the supervisor writes to this process's stdout)."""
    if target is None:
        return None
    from xpulaunch.joblog.event_stream import EventStream

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


class Operations:
    """The event stream, ``summary.json`` and the metrics endpoint of one run, each only when
    the request asks for it; ``events`` is the caller's open stream (left open)."""

    def __init__(
        self,
        plan: Plan,
        request: RunRequest,
        supervisor: Supervisor,
        events: EventStream | None,
    ) -> None:
        self._log_dir = request.log_dir
        self.events = events
        devices = [u.label() for u in plan.devices]
        argv = plan.workers[0].argv if plan.workers else ()
        self.summary: RunSummary | None = None
        if self._log_dir:
            from xpulaunch.joblog.run_summary import RunSummary

            self.summary = RunSummary(supervisor.job_id, argv, devices)
        self.metrics: MetricsServer | None = None
        if request.metrics_port is not None:
            from xpulaunch.joblog.metrics import MetricsServer

            self.metrics = MetricsServer(
                supervisor,
                plan,
                host=request.metrics_host,
                port=request.metrics_port,
                interval_s=request.metrics_interval_s,
            )
            url = f"http://{request.metrics_host}:{self.metrics.port}/metrics"
            supervisor.message(f"metrics on {url}")

    @property
    def listeners(self) -> list[Callable[[Event], None]]:
        found = [
            self.events.write if self.events else None,
            self.summary.on_event if self.summary else None,
            self.metrics.on_event if self.metrics else None,
        ]
        return [f for f in found if f is not None]

    def replay(self, event: Event) -> None:
        """An event from before the supervisor (the lease's): not for the stream again."""
        for listen in (self.summary, self.metrics):
            if listen is not None:
                listen.on_event(event)

    def __enter__(self) -> Operations:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.metrics is not None:
            self.metrics.close()
        written: str | None = None
        if self.summary is not None and self._log_dir is not None:
            written = self.summary.write(self._log_dir)
        if written is not None and self._log_dir is not None:
            from xpulaunch.joblog.logs import remove_running_lock

            remove_running_lock(self._log_dir)  # summary.json now says the run is over
