"""``summary.json``: what a run did, written to ``--log-dir`` when it ends.

Built from the supervisor's events (the same objects ``--events`` writes), so it says what
the user saw: schema :data:`SCHEMA`::

    {"schema": "xpulaunch.run/1", "job_id": "...", "command": [...],
     "devices": ["cuda:0 (0000:17:00.0)"], "started_at": "...Z", "ended_at": "...Z",
     "exit_code": 1, "reason": "worker 0 failed", "restarts": {"0": 1, "1": 1},
     "attempts": [{"attempt": 0, "workers": {"0": {"pid": 42, "exit_code": 1,
                   "signal": null, "duration_s": 3.2, "root_cause": {...} | null}}}],
     "root_cause": {"worker": "0", "attempt": 1, "type": "ValueError", "message": "...",
                    "frames": [...], "source": "error_file"} | null}

``root_cause`` is the first failure of the last attempt that failed (the one that ended the
run), or null when the run did not fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import TYPE_CHECKING

from xpulaunch.core.units import iso_utc
from xpulaunch.events import Exited, HangDetected, Started, Stopped, Unhealthy
from xpulaunch.joblog.console import append_whole, warn_on_stderr

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from xpulaunch.events import Event

SCHEMA = "xpulaunch.run/1"
FILE_NAME = "summary.json"


class RunSummary:
    """Collects a run's events (``on_event``, from the supervisor's loop thread)."""

    def __init__(self, job_id: str, command: Sequence[str], devices: Sequence[str]) -> None:
        self._head: dict[str, object] = {
            "schema": SCHEMA,
            "job_id": job_id,
            "command": list(command),
            "devices": list(devices),
            "started_at": iso_utc(time.time()),
        }
        self._runs: dict[tuple[str, int], dict[str, object]] = {}
        self._started_s: dict[tuple[str, int], float] = {}
        self._attempt: dict[str, int] = {}
        self._failures: list[dict[str, object]] = []  # first failure of each failed attempt
        self._end: Stopped | None = None

    def on_event(self, event: Event) -> None:
        if isinstance(event, Started):
            key = (event.name, event.attempt)
            self._attempt[event.name] = event.attempt
            self._started_s[key] = event.time_s
            self._runs[key] = {
                "pid": event.pid,
                "exit_code": None,
                "signal": None,
                "duration_s": None,
                "root_cause": None,
            }
        elif isinstance(event, Exited):
            self._exited(event)
        elif isinstance(event, Unhealthy | HangDetected):
            self._failed(event.name, _supervisor_cause(event))
        elif isinstance(event, Stopped):
            self._end = event

    def _exited(self, event: Exited) -> None:
        key = (event.name, self._attempt.get(event.name, 0))
        run = self._runs.setdefault(key, {"pid": event.pid})
        started_s = self._started_s.get(key)
        cause = event.root_cause.as_dict() if event.root_cause is not None else None
        duration_s = None if started_s is None else round(event.time_s - started_s, 3)
        run.update(
            exit_code=event.exit_code, signal=event.signal, root_cause=cause, duration_s=duration_s
        )
        if not event.expected and event.exit_code != 0:
            fallback: dict[str, object] = {
                "type": None,
                "message": _how(event),
                "frames": list(event.stderr_tail[-10:]),
                "source": "exit",
            }
            self._failed(event.name, cause or fallback)

    def _failed(self, name: str, cause: dict[str, object]) -> None:
        attempt = self._attempt.get(name, 0)
        if not any(f["attempt"] == attempt for f in self._failures):
            self._failures.append({"worker": name, "attempt": attempt, **cause})

    def document(self) -> dict[str, object]:
        attempts: dict[int, dict[str, object]] = {}
        for (name, attempt), run in sorted(self._runs.items(), key=lambda kv: kv[0][1]):
            attempts.setdefault(attempt, {})[name] = run
        return {
            **self._head,
            "ended_at": iso_utc(time.time()),
            "exit_code": None if self._end is None else self._end.exit_code,
            "reason": None if self._end is None else self._end.reason,
            "restarts": dict(self._attempt),
            "attempts": [{"attempt": a, "workers": w} for a, w in sorted(attempts.items())],
            "root_cause": self._root_cause(),
        }

    def _root_cause(self) -> dict[str, object] | None:
        if self._end is None or self._end.exit_code == 0 or not self._failures:
            return None
        return self._failures[-1]

    def write(
        self, log_dir: str | os.PathLike[str], *, warn: Callable[[str], None] = warn_on_stderr
    ) -> str | None:
        """Write ``summary.json`` atomically (a reader never sees half of it); its path.

        A summary that cannot be written (a full disk, a log dir removed meanwhile) is one
        warning and None, never an error: the job's own exit status stands, and no partial
        file is left behind."""
        path = os.path.join(log_dir, FILE_NAME)
        partial = path + ".tmp"
        data = (json.dumps(self.document(), indent=2) + "\n").encode()
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
            try:
                append_whole(fd, data)
            finally:
                os.close(fd)
            os.replace(partial, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            warn(f"{path}: {exc.strerror or exc}; not written")
            return None
        return path


def _supervisor_cause(event: Unhealthy | HangDetected) -> dict[str, object]:
    """A failure the supervisor declared: a failed health check, or a hang."""
    if isinstance(event, Unhealthy):
        why = event.reason
    else:
        why = f"silent for {event.silent_s:.0f} s (no {event.watched})"
    return {"type": type(event).__name__, "message": why, "frames": [], "source": "supervisor"}


def _how(event: Exited) -> str:
    if event.signal is not None:
        return f"killed by {event.signal}"
    return f"exited with code {event.exit_code}"
