"""Health checks of a worker run (readiness, then liveness), without threads or clocks.

A :class:`~xpulaunch.supervisor.spec.HealthCheck` (public name) describes one check; a
:class:`HealthCheckRun` holds the state of one worker run's checks. The worker calls
:meth:`HealthCheckRun.tick` every ``interval_s`` and :meth:`HealthCheckRun.result` when a
check (run on a helper thread) answers, and acts on the verdict. Readiness failures are
expected until ``start_deadline_s``; liveness failures count until ``failure_threshold`` in a
row. A check that has not answered within ``timeout_s`` counts as one failure per tick
(llama-swap's bounded readiness). Liveness exists because a server can stay up but stop
answering, which no exit status reports.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from xpulaunch.supervisor.spec import HealthCheck


class Verdict(str, Enum):
    """What the worker should do after a tick or an answer."""

    SUBMIT = "submit"  # run the check now
    READY = "ready"
    UNHEALTHY = "unhealthy"


class HealthCheckRun:
    def __init__(
        self, readiness: HealthCheck | None, liveness: HealthCheck | None, started_at_s: float
    ):
        self._readiness, self._liveness = readiness, liveness
        self._started_at_s = started_at_s
        self.ready = readiness is None
        self.in_flight_since_s: float | None = None
        self._timed_out = False
        self.failures = 0
        self.detail = ""

    @property
    def check(self) -> HealthCheck | None:
        """The check in charge now: readiness until it passed, then liveness."""
        return self._liveness if self.ready else self._readiness

    def tick(self, now_s: float) -> Verdict | None:
        check = self.check
        if check is None:
            return None
        if not self.ready and now_s - self._started_at_s >= check.start_deadline_s:
            self.detail = f"not ready after {check.start_deadline_s:g} s"
            return Verdict.UNHEALTHY
        if self.in_flight_since_s is None:
            self.in_flight_since_s = now_s
            return Verdict.SUBMIT
        if now_s - self.in_flight_since_s >= check.timeout_s:
            self._timed_out = True
            return self._failed(f"check did not answer within {check.timeout_s:g} s")
        return None

    def result(self, ok: bool, detail: str) -> Verdict | None:
        """A check answered; ``detail`` says why it failed."""
        late, self._timed_out = self._timed_out, False
        self.in_flight_since_s = None
        if ok:
            self.failures = 0
            if not self.ready:
                self.ready = True
                return Verdict.READY
            return None
        return None if late else self._failed(detail)

    def _failed(self, detail: str) -> Verdict | None:
        check = self.check
        if not self.ready or check is None:
            return None  # not ready yet is normal until the start deadline
        self.failures += 1
        self.detail = f"liveness check failed {self.failures} times in a row: {detail}"
        return Verdict.UNHEALTHY if self.failures >= check.failure_threshold else None


def run_check(check: Callable[[], bool]) -> tuple[bool, str]:
    """Run one check on a helper thread: (healthy, why not)."""
    try:
        return (True, "") if check() else (False, "check returned False")
    except Exception as exc:  # noqa: BLE001
        # Connection refused, timeouts, URLError: an unhealthy answer. And a check is user
        # code: whatever it raises, the answer is "not healthy", and the exception is
        # carried into the Unhealthy event's reason rather than lost.
        return False, f"{type(exc).__name__}: {exc}"
