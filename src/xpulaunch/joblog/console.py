"""The supervisor's console: streams written so that a reader who stops reading never
blocks the supervisor, and the run's own lines there (:class:`Reporter`).

A write to a pipe or terminal blocks while its reader does not read: a paused pager, a
terminal stopped with Ctrl-S, a stuck log shipper. If the loop thread made that write, stop
signals, ``--grace`` deadlines and restarts would all wait for the reader. So the loop only
appends to a bounded buffer and one writer thread per stream makes the blocking
``os.write``. When the buffer is full, new output is dropped and counted, and a line saying
how much was lost is written once the reader catches up (the journald and Docker log-driver
choice: never block the producer; say what was dropped).

The descriptor is written with ``os.write`` rather than through ``sys.stdout.buffer``: a
thread blocked inside a ``BufferedWriter`` holds its lock, and the interpreter would then hang
(or abort) flushing that stream at exit. Setting ``O_NONBLOCK`` instead is not an option: it
belongs to the open file description, shared with the shell and every other process on the
terminal.

A stream that fails for another reason than a reader who went away (a console redirected to a
full disk: ENOSPC; an I/O error) is reported once, through ``on_error`` (the other console
stream, as :class:`~xpulaunch.joblog.logs.LogSink` wires it), and no longer written.

What a user reads on the console about the job: :class:`Reporter` turns supervisor events
into the few lines that matter (a hang, a restart and why, who failed first and where), written
through the supervisor's own console so that they never tear a worker's line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from xpulaunch.events import (
    STACK_DUMP_HEADER,
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

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import BinaryIO

BUFFER_LIMIT_BYTES = 4 * 1024 * 1024
CLOSE_WAIT_S = 2.0  # how long the end of a job waits for a slow reader to take the rest
# The reader went away (`| head`: EPIPE): what a program killed by SIGPIPE would not report.
_READER_GONE = frozenset({errno.EPIPE})


class QueuedWriter:
    """A bounded buffer of chunks and the one daemon thread that writes them out (in
    :meth:`_write_chunk`): what the console streams and ``--events`` share, so that a reader
    who does not read never blocks the thread that queues."""

    def __init__(self, limit_bytes: int, thread_name: str) -> None:
        self._limit_bytes, self._thread_name = limit_bytes, thread_name
        self._idle = threading.Condition()
        self._chunks: deque[bytes] = deque()
        self._buffered_bytes = 0
        self._closed = False
        self._busy = False  # the writer thread holds a chunk it has not written yet
        self._broken = False  # nothing more is written (the reader went away, say)
        self._thread: threading.Thread | None = None

    def _queue(self, data: bytes) -> bool:
        """Queue ``data`` (the caller holds ``_idle``); False when the buffer has no room."""
        if self._buffered_bytes + len(data) > self._limit_bytes:
            return False
        self._chunks.append(data)
        self._buffered_bytes += len(data)
        self._idle.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name=self._thread_name, daemon=True)
            self._thread.start()
        return True

    def _drain(self) -> None:
        while (data := self._next_chunk()) is not None:
            self._write_chunk(data)
            with self._idle:
                self._busy = False
                self._idle.notify_all()  # close() waits for the writer to be idle

    def _next_chunk(self) -> bytes | None:
        with self._idle:
            while not (self._chunks or self._closed or self._broken):
                self._idle.wait()
            if self._broken or not self._chunks:
                return None
            data = self._chunks.popleft()
            self._buffered_bytes -= len(data)
            self._busy = True
        return data

    def _write_chunk(self, data: bytes) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        """Write nothing more; what is buffered is dropped."""
        with self._idle:
            self._broken = True
            self._chunks.clear()
            self._buffered_bytes = 0
            self._busy = False
            self._idle.notify_all()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Give the reader up to ``wait_s`` to take what is buffered; then abandon it (the
        writer is a daemon thread: a reader that never reads cannot keep us alive)."""
        deadline_s = time.monotonic() + wait_s
        with self._idle:
            self._closed = True
            self._idle.notify_all()
            while (self._chunks or self._busy) and self._thread is not None:
                left_s = deadline_s - time.monotonic()
                if left_s <= 0 or not self._idle.wait(left_s):
                    break


class Console(QueuedWriter):
    """One output stream. :meth:`write` never blocks; a writer thread drains the buffer.

    ``on_error(exc)``: called once (from the writer thread) when writing fails for another
    reason than a reader that went away.
    """

    def __init__(
        self,
        stream: BinaryIO,
        limit_bytes: int = BUFFER_LIMIT_BYTES,
        *,
        on_error: Callable[[OSError], None] | None = None,
    ) -> None:
        super().__init__(limit_bytes, "xpulaunch-console")
        self._fd = _file_descriptor(stream)
        self._stream = stream
        self._on_error = on_error
        self._dropped_lines = 0  # since the last write that fitted
        self.dropped_lines_total = 0

    @property
    def broken(self) -> bool:
        """The reader went away (EPIPE, EIO): nothing more is written."""
        return self._broken

    def write(self, data: bytes) -> None:
        if self._broken:
            return
        if self._fd is None:  # an in-memory stream (tests, embedding): it cannot block
            self._write_now(data)
            return
        with self._idle:
            data = self._gap_note() + data  # the reader caught up after a gap: mark it
            if not self._queue(data):
                lines = data.count(b"\n") - (1 if self._dropped_lines else 0)
                self._dropped_lines += lines
                self.dropped_lines_total += lines
                return
            self._dropped_lines = 0

    def _gap_note(self) -> bytes:
        if not self._dropped_lines:
            return b""
        text = f"xpulaunch: {self._dropped_lines} lines of output dropped here: "
        return (text + "the console was not reading\n").encode()

    def _write_chunk(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        try:
            while view:  # a short write (a full pipe, a disk filling up) writes the rest next
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            # The reader went away (``xpulaunch ... | head``: EPIPE), the terminal closed
            # (EIO) or the disk is full. Keep supervising and keep the log files; stop
            # writing to that stream, saying so (on the other one) unless nobody reads it.
            self._failed(exc)

    def _write_now(self, data: bytes) -> None:
        try:
            self._stream.write(data)
            self._stream.flush()
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self._stop()
        if self._on_error is not None and exc.errno not in _READER_GONE:
            report, self._on_error = self._on_error, None
            report(exc)


def _file_descriptor(stream: BinaryIO) -> int | None:
    """The stream's descriptor, with what Python buffered for it written out first; None for
    a stream without one."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.BytesIO: UnsupportedOperation (OSError)
        return None
    with contextlib.suppress(OSError, ValueError):
        stream.flush()
    return fd


def append_whole(fd: int, data: bytes) -> None:
    """Write all of ``data`` (a short write writes the rest next). When a write to a regular
    file fails (ENOSPC, EIO), the file is cut back to the end of the last whole line of
    ``data`` that was written before the error is raised: it never ends in half a line."""
    regular = stat.S_ISREG(os.fstat(fd).st_mode)
    start = os.lseek(fd, 0, os.SEEK_END) if regular else 0
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        written = len(data) - len(view)
        if regular and written:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start + data.rfind(b"\n", 0, written) + 1)
        raise


def warn_on_stderr(text: str, wait_s: float = CLOSE_WAIT_S) -> None:
    """``xpulaunch: warning: TEXT`` on stderr, for what fails outside a job's console (before
    it starts, or as it ends). Written by a helper thread that is waited for at most
    ``wait_s``: a stderr nobody reads must not keep a finished job from exiting. A stderr
    that cannot be written is not reported again."""
    try:
        fd = sys.stderr.fileno()
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # closed, or not a file
        return
    data = f"xpulaunch: warning: {text}\n".encode()

    def write() -> None:
        view = memoryview(data)
        with contextlib.suppress(OSError):
            while view:
                view = view[os.write(fd, view) :]

    writer = threading.Thread(target=write, name="xpulaunch-warning", daemon=True)
    writer.start()
    writer.join(wait_s)


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
        elif tail and not any(STACK_DUMP_HEADER in line for line in tail):  # shown above
            self._say(f"last lines of worker {failure.name}'s stderr:")
            for line in tail[-10:]:
                self._say(f"  {line}")
        path = self.supervisor.log_path(failure.name) if self.supervisor else None
        if path is not None:
            self._say(f"full log: {path}")
