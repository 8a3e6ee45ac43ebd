"""What a user reads on the console about the job: :class:`Reporter` turns supervisor events
into the few lines that matter (a hang, a restart and why, who failed first and where), written
through the supervisor's own console so that they never tear a worker's line."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from xpulaunch.events import (
    Event,
    Exited,
    GaveUp,
    HangDetected,
    Restarting,
    SignalForwarded,
    Stopping,
    TimedOut,
    Unhealthy,
)


class JobConsole(Protocol):
    """Where the lines go (a :class:`~xpulaunch.supervisor.supervisor.Supervisor`)."""

    def message(self, text: str) -> None: ...

    def log_path(self, name: str) -> Path | None: ...


Failure = Exited | Unhealthy | HangDetected


class Reporter:
    """Turns supervisor events into the few lines a user needs, and the failure summary."""

    def __init__(self) -> None:
        self.supervisor: JobConsole | None = None
        self._failures: dict[str, Failure] = {}
        self._exits: dict[str, Exited] = {}

    def _say(self, text: str) -> None:
        if self.supervisor is not None:
            self.supervisor.message(text)

    def on_event(self, event: Event) -> None:
        if isinstance(event, Exited):
            self._exits[event.name] = event
            if not event.expected and event.exit_code != 0:
                self._failures.setdefault(event.name, event)
        elif isinstance(event, Unhealthy):
            self._failures.setdefault(event.name, event)
        elif isinstance(event, HangDetected):
            self._failures.setdefault(event.name, event)
            silent = f"silent for {event.silent_s:.0f} s (no {event.watched})"
            self._say(f"worker {event.name} {silent}: treating it as failed")
        elif isinstance(event, TimedOut):
            self._say(f"ran for --max-runtime {event.max_runtime_s:g} s: stopping every worker")
        elif isinstance(event, Restarting):
            self._restarting(event)
        elif isinstance(event, GaveUp):
            self._gave_up(event)
        elif isinstance(event, SignalForwarded):
            who = ", ".join(event.names) or "none running"
            self._say(f"{event.signal}: sent on to the workers ({who}); the job goes on")
        elif isinstance(event, Stopping) and (event.cause == "signal" or event.kill):
            what = "killing every process now" if event.kill else "stopping every worker"
            again = "" if event.kill else " (again to kill at once)"
            self._say(f"{event.signal}: {what}{again}")

    def _first_failure(self, names: Sequence[str]) -> Failure | None:
        failures = [self._failures[n] for n in names if n in self._failures]
        return min(failures, key=lambda e: e.time_s, default=None)

    def _what(self, failure: Failure) -> str:
        if isinstance(failure, Unhealthy):
            return f"was unhealthy ({failure.reason})"
        if isinstance(failure, HangDetected):
            return f"was silent for {failure.silent_s:.0f} s (no {failure.watched})"
        if failure.root_cause is not None:
            return f"raised {failure.root_cause.headline()} (exit status {failure.exit_code})"
        if failure.signal is not None:
            return f"was killed by {failure.signal} (exit status {failure.exit_code})"
        return f"exited with code {failure.exit_code}"

    def _restarting(self, event: Restarting) -> None:
        failure = self._first_failure(event.names)
        who = "" if failure is None else f"worker {failure.name} {self._what(failure)}; "
        scope = "all workers" if len(event.names) > 1 else f"worker {event.names[0]}"
        self._say(f"{who}restarting {scope}: {event.reason}")
        for name in event.names:
            self._failures.pop(name, None)

    def _gave_up(self, event: GaveUp) -> None:
        failure = self._first_failure(event.names)
        if failure is None:
            self._say(f"gave up ({event.reason}), exit status {event.exit_code}")
            return
        self._say(f"worker {failure.name} failed first: it {self._what(failure)}")
        self._say(f"gave up: {event.reason}")
        exited = self._exits.get(failure.name)
        tail = exited.stderr_tail if exited is not None else ()
        cause = exited.root_cause if exited is not None else None
        if cause is not None and cause.frames:
            self._say(f"where worker {failure.name} raised it (innermost last):")
            for frame in cause.frames:
                self._say(f"  {frame}")
        elif tail:
            self._say(f"last lines of worker {failure.name}'s stderr:")
            for line in tail[-10:]:
                self._say(f"  {line}")
        path = self.supervisor.log_path(failure.name) if self.supervisor else None
        if path is not None:
            self._say(f"full log: {path}")
