"""``--events FILE|-``: every supervisor event as one JSON object per line.

Each line is the :mod:`xpulaunch.events` dataclass the Python API hands to ``on_event``,
field by field, plus ``schema`` (:data:`SCHEMA`), ``event`` (the class name in snake case:
``started``, ``exited``, ``hang_detected`` ...) and ``time`` (wall clock, ISO 8601 UTC; the
event's own ``time_s`` is on the supervisor's monotonic clock)::

    {"schema": "xpulaunch.event/1", "event": "exited", "time": "2026-11-23T23:30:01.123Z",
     "time_s": 5123.4, "name": "0", "pid": 4242, "exit_code": 1, "signal": null, ...}

Lines are written whole and flushed one by one, so ``tail -f`` and a pipe reader see each
event as it happens.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import threading
import time
from typing import TYPE_CHECKING

from xpulaunch.core.units import iso_utc
from xpulaunch.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import TextIO

    from xpulaunch.events import Event

SCHEMA = "xpulaunch.event/1"


def event_name(event: Event) -> str:
    """``HangDetected`` -> ``hang_detected``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(event).__name__).lower()


def event_record(event: Event, wall_s: float) -> dict[str, object]:
    """The JSON object of one event (``wall_s``: seconds since the epoch)."""
    record: dict[str, object] = {
        "schema": SCHEMA, "event": event_name(event), "time": iso_utc(wall_s),
    }  # fmt: skip
    for field in dataclasses.fields(event):
        record[field.name] = _plain(getattr(event, field.name))
    return record


def _plain(value: object) -> object:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    as_dict = getattr(value, "as_dict", None)
    return as_dict() if callable(as_dict) else value


class EventStream:
    """Writes events to a file (appending) or to standard output (``-``); thread-safe."""

    def __init__(self, target: str) -> None:
        self._lock = threading.Lock()
        if target == "-":
            self._stream: TextIO = sys.stdout
            self._owned = False
        else:
            try:
                self._stream = open(target, "a", encoding="utf-8")  # noqa: SIM115 (see close())
            except OSError as exc:
                raise UsageError(f"--events {target}: cannot write it ({exc.strerror})") from exc
            self._owned = True

    @classmethod
    def to(cls, stream: TextIO) -> EventStream:
        """A stream over an open text file, closed by :meth:`close`."""
        self = cls.__new__(cls)
        self._lock, self._stream, self._owned = threading.Lock(), stream, True
        return self

    def write(self, event: Event, extra: Mapping[str, object] | None = None) -> None:
        """One line; ``extra`` keys go first (the model router names the model)."""
        record = {**(extra or {}), **event_record(event, time.time())}
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            try:
                self._stream.write(line)
                self._stream.flush()
            except (OSError, ValueError):
                pass  # the reader went away (a closed pipe): supervising matters more

    def close(self) -> None:
        if self._owned:
            with self._lock:
                self._stream.close()
