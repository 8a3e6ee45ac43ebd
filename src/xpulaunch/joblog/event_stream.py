"""``--events FILE|-``: every supervisor event as one JSON object per line.

Each line is the :mod:`xpulaunch.events` dataclass the Python API hands to ``on_event``,
field by field, plus ``schema`` (:data:`SCHEMA`), ``event`` (the class name in snake case:
``started``, ``exited``, ``hang_detected`` ...) and ``time`` (wall clock, ISO 8601 UTC; the
event's own ``time_s`` is on the supervisor's monotonic clock)::

    {"schema": "xpulaunch.event/1", "event": "exited", "time": "2026-11-23T23:30:01.123Z",
     "time_s": 5123.4, "name": "0", "pid": 4242, "exit_code": 1, "signal": null, ...}

Lines are written whole and one by one, so ``tail -f`` and a pipe reader see each event as it
happens. Like the console (:mod:`xpulaunch.joblog.console`), the stream never blocks the
supervisor: :meth:`EventStream.write` appends to a bounded buffer that a writer thread drains,
so a reader that stops reading (``--events -`` into a stuck pipe, a FIFO whose reader stalls)
costs dropped events, counted and reported, never a frozen loop. A FIFO with no reader yet is
opened by the writer thread, once a reader comes. A write that fails (a full disk) loses that
event only: the file is cut back to its last whole line (a JSONL reader never meets half an
object), and the first failure is reported once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import stat
import sys
import time
from typing import TYPE_CHECKING

from xpulaunch.core.units import iso_utc
from xpulaunch.errors import UsageError
from xpulaunch.joblog.console import (
    BUFFER_LIMIT_BYTES,
    CLOSE_WAIT_S,
    QueuedWriter,
    append_whole,
    warn_on_stderr,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import TextIO

    from xpulaunch.events import Event

SCHEMA = "xpulaunch.event/1"


def event_name(event: Event) -> str:
    """``HangDetected`` -> ``hang_detected``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(event).__name__).lower()


def event_record(event: Event, wall_s: float) -> dict[str, object]:
    """The JSON object of one event (``wall_s``: seconds since the epoch)."""
    record: dict[str, object] = {
        "schema": SCHEMA,
        "event": event_name(event),
        "time": iso_utc(wall_s),
    }
    for field in dataclasses.fields(event):
        record[field.name] = _plain(getattr(event, field.name))
    return record


def _plain(value: object) -> object:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    as_dict = getattr(value, "as_dict", None)
    return as_dict() if callable(as_dict) else value


class EventStream(QueuedWriter):
    """Writes events to a file (appending) or to standard output (``-``); thread-safe, and
    :meth:`write` never blocks. ``warn(text)`` reports a failed or stalled stream (default: a
    line on stderr)."""

    _open_later: str | None  # a FIFO nobody reads yet: the writer thread waits for a reader

    def __init__(
        self,
        target: str,
        *,
        warn: Callable[[str], None] = warn_on_stderr,
        limit_bytes: int = BUFFER_LIMIT_BYTES,
    ) -> None:
        name = "--events -" if target == "-" else f"--events {target}"
        self._setup(name, warn, limit_bytes, None)
        if target == "-":
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
            self._fd: int | None = sys.stdout.fileno()
            self._owned = False
        else:
            self._fd, self._owned = _open(target), True
            if self._fd is None:
                self._open_later = target

    @classmethod
    def to(cls, stream: TextIO, *, warn: Callable[[str], None] = warn_on_stderr) -> EventStream:
        """A stream over an open file, closed by :meth:`close`."""
        self = cls.__new__(cls)
        self._setup("--events -", warn, BUFFER_LIMIT_BYTES, stream)
        self._fd, self._owned = stream.fileno(), True
        return self

    def _setup(
        self, name: str, warn: Callable[[str], None], limit_bytes: int, file: TextIO | None
    ) -> None:
        super().__init__(limit_bytes, "xpulaunch-events")
        self._name, self._warn = name, warn
        self._file = file  # the file object to close instead of the bare descriptor
        self._open_later = None
        self.dropped = 0  # events that did not fit the buffer (a reader not reading)
        self.failed = 0  # events whose write failed (a full disk)

    def write(self, event: Event, extra: Mapping[str, object] | None = None) -> None:
        """One whole line, queued for the writer thread; ``extra`` keys go first (the model
        router names the model)."""
        record = {**(extra or {}), **event_record(event, time.time())}
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._idle:
            if self._broken or self._closed:
                return
            if not self._queue(line.encode()):
                self.dropped += 1

    def _drain(self) -> None:
        if self._open_later is not None:
            try:
                self._fd = os.open(self._open_later, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            except OSError as exc:
                self._stop()
                self._warn(f"{self._name}: {exc.strerror or exc}; events are not written")
                return
        super()._drain()

    def _write_chunk(self, data: bytes) -> None:
        assert self._fd is not None
        try:
            append_whole(self._fd, data)
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # the reader went away: supervising matters more
                self._stop()
                return
            self.failed += 1
            if self.failed == 1:
                self._warn(f"{self._name}: {exc.strerror or exc}; events are lost while it fails")

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Give the reader up to ``wait_s`` to take what is buffered, say what was lost, and
        close the file (not while the writer is stuck in a write: the process ends soon)."""
        super().close(wait_s)
        with self._idle:
            stuck = bool(self._chunks or self._busy)
            waiting_for_reader = self._fd is None and self._open_later is not None
            lost = self.dropped + len(self._chunks) + (1 if self._busy else 0)
        if waiting_for_reader and self._thread is not None:
            self._warn(f"{self._name}: no process opened it for reading; {lost} events not written")
        elif lost:
            self._warn(f"{self._name}: {lost} events dropped: its reader was not reading")
        if self._owned and not stuck and self._fd is not None:
            with contextlib.suppress(OSError):  # NFS may report a failed write-back only here
                if self._file is not None:
                    self._file.close()
                else:
                    os.close(self._fd)
            self._fd = None


def _open(target: str) -> int | None:
    """Open ``target`` to append, never blocking: None for a FIFO that no process reads yet.
    A path that cannot be written is a one-line UsageError."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(target, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ENXIO and _is_fifo(target):
            return None
        raise UsageError(f"--events {target}: cannot write it ({exc.strerror})") from exc
    os.set_blocking(fd, True)  # the writer thread may block; the loop never writes
    return fd


def _is_fifo(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False
