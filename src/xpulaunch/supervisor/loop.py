"""The event loop under the supervisor: one ``selectors`` wait, timers, an inbox, and the
board where the loop thread publishes for every other thread to read.

One thread runs :meth:`Loop.run_once` over and over. It blocks in a single ``select`` on a
wake-up pipe plus whatever the supervisor registered (worker pipes, pidfds); the nearest
timer sets the timeout. Other threads and signal handlers hand work to the loop with
:meth:`Loop.post`, which takes no lock: a handler may interrupt a ``post`` on the same
thread, and a lock there would deadlock (found the hard way: two quick Ctrl-Cs).

The loop thread alone changes workers (:mod:`xpulaunch.supervisor.engine`); the public
:class:`~xpulaunch.supervisor.supervisor.Supervisor` methods run on other threads and only read what
is posted here: the latest worker statuses, the events so far, and whether the job has started
and ended. One condition variable guards all of it, so a reader that sees an event also sees a
status at least as new.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import selectors
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from xpulaunch.events import Event, WorkerStatus

if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Future
    from typing import TypeVar

    R = TypeVar("R")
    Action = Callable[[], None]


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def _run_into(fn: Callable[[], R], future: Future[R]) -> None:
    """A helper thread's body: ``fn``'s result or exception goes into ``future``."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn()
    except BaseException as exc:  # noqa: BLE001 (re-raised on the loop by future.result())
        future.set_exception(exc)
    else:
        future.set_result(result)


class Loop:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Closed only once nobody holds the loop, so post() never writes to a reused fd.
        weakref.finalize(self, _close_fds, self._wake_r, self._wake_w)
        self.selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._timers: list[tuple[float, int, Action]] = []
        self._seq = itertools.count()
        self._inbox: deque[Action] = deque()

    def post(self, action: Action) -> None:
        """Run ``action`` on the loop thread; safe from any thread and signal handler."""
        self._inbox.append(action)
        with contextlib.suppress(BlockingIOError):  # a full pipe will wake the loop anyway
            os.write(self._wake_w, b"\0")

    def call_at(self, when_s: float, action: Action) -> None:
        """Run ``action`` on the loop once the clock reaches ``when_s``."""
        heapq.heappush(self._timers, (when_s, next(self._seq), action))

    def submit(self, fn: Callable[[], R], then: Callable[[Future[R]], None]) -> None:
        """Run ``fn`` on a helper thread; ``then(future)`` runs on the loop afterwards.

        One daemon thread per call, not a ``ThreadPoolExecutor``: the interpreter joins an
        executor's threads at exit, so a health check still waiting for its answer delayed
        every exit by up to its timeout (2.4 s seen on a busy port). A daemon thread is
        abandoned instead. Calls are few: one check in flight per worker run.
        """
        # Imported here: only jobs with health checks or a settle hook need threads.
        from concurrent.futures import Future

        future: Future[R] = Future()
        future.add_done_callback(lambda f: self.post(lambda: then(f)))
        thread = threading.Thread(
            target=_run_into, args=(fn, future), name="xpulaunch-check", daemon=True
        )
        thread.start()

    def run_once(self, *, busy: bool = False) -> None:
        """Wait for fds or the next timer (not at all when ``busy``), then run what is due."""
        for key, _ in self.selector.select(self._timeout(busy)):
            if key.data is not None:
                key.data()
            else:
                self._drain_wake_pipe()
        now = self.clock()
        while self._timers and self._timers[0][0] <= now:
            heapq.heappop(self._timers)[2]()
        while self._inbox:
            self._inbox.popleft()()

    def _timeout(self, busy: bool) -> float | None:
        if busy or self._inbox:
            return 0.0
        if not self._timers:
            return None  # nothing scheduled: sleep until an fd or a post wakes us
        return max(self._timers[0][0] - self.clock(), 0.0)

    def _drain_wake_pipe(self) -> None:
        with contextlib.suppress(BlockingIOError):  # emptied
            while os.read(self._wake_r, 4096):
                pass

    def close(self) -> None:
        self.selector.close()  # helper threads still running post into a loop nobody runs


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
