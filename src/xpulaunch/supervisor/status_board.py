"""What the supervisor's loop thread publishes for every other thread to read.

The loop thread alone changes workers (:mod:`xpulaunch.supervisor.engine`); the public
:class:`~xpulaunch.supervisor.supervisor.Supervisor` methods run on other threads and only read what
is posted here: the latest worker statuses, the events so far, and whether the job has started
and ended. One condition variable guards all of it, so a reader that sees an event also sees a
status at least as new.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from xpulaunch.events import Event, WorkerStatus

EVENTS_KEPT = 10_000  # the newest events; a long job's history stays bounded


class StatusBoard:
    def __init__(self, statuses: Sequence[WorkerStatus]) -> None:
        self._cond = threading.Condition()
        self._statuses = list(statuses)
        self._events: deque[Event] = deque(maxlen=EVENTS_KEPT)
        self._started = threading.Event()
        self._done = threading.Event()

    # -- written by the loop thread ---------------------------------------------------------
    def publish(self, statuses: Sequence[WorkerStatus]) -> None:
        with self._cond:
            if list(statuses) != self._statuses:
                self._statuses = list(statuses)
                self._cond.notify_all()

    def add_event(self, event: Event) -> None:
        with self._cond:
            self._events.append(event)

    def mark_started(self) -> None:
        self._started.set()

    def mark_done(self) -> None:
        self._started.set()  # a loop that ended before starting anything wakes wait_started
        self._done.set()
        with self._cond:
            self._cond.notify_all()

    # -- read by any thread -------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._started.is_set()

    def wait_started(self) -> None:
        self._started.wait()

    def wait_done(self, timeout: float | None) -> bool:
        return self._done.wait(timeout)

    def wait_ready(self, timeout: float | None) -> bool:
        """True once every worker is ready; False on timeout or when the job ended first."""

        def settled() -> bool:
            return self._done.is_set() or all(s.ready for s in self._statuses)

        with self._cond:
            self._cond.wait_for(settled, timeout)
            return not self._done.is_set() and all(s.ready for s in self._statuses)

    def statuses(self) -> list[WorkerStatus]:
        with self._cond:
            return list(self._statuses)

    def events(self) -> list[Event]:
        with self._cond:
            return list(self._events)
