"""Reading a run's ``--log-dir`` back: its attempts, its workers' files, new lines as they come.

Both layouts of :mod:`xpulaunch.joblog.logs` are read: ours (``attempt_<n>/<name>.log``, each
line starting with its UTC time stamp) and torchrun's (``attempt_<n>/<local_rank>/stdout.log``
and ``stderr.log``, lines as the worker wrote them, in a ``<run_id>_<random>`` directory of
its own); plus ``summary.json``, written into the run's directory when the run ends, and
``.running.lock``, which the run's supervisor holds locked while it runs
(:func:`~xpulaunch.joblog.logs.hold_running_lock`): a follower knows the run is over once
that lock is free, also when the supervisor was killed and no ``summary.json`` will come.

Files are read as streams, line by line, and the workers' lines merged (k-way, by time
stamp) as they are read: the logs of a long run of many ranks are never held in memory. Only
regular files are read: a log that is a FIFO or a link to a device (``/dev/zero``) is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import heapq
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from xpulaunch.errors import UsageError
from xpulaunch.joblog.logs import MAX_LINE_BYTES, RUNNING_LOCK, LogLayout
from xpulaunch.joblog.run_summary import FILE_NAME as SUMMARY_FILE

_READ_BYTES = 256 * 1024
# A line longer than this (a log written by something else) is read in pieces.
_MAX_PIECE_BYTES = 4 * MAX_LINE_BYTES

_ATTEMPT = re.compile(r"^attempt_(\d+)$")
_STAMP_BYTES = 25  # "2026-11-23T23:32:13.123Z "
_STREAM_FILES = ("stdout.log", "stderr.log")  # torchrun's, in the order they are read back


@dataclass(frozen=True, slots=True)
class RunLogs:
    """One run's log directory: where it is, how it is laid out, and how many runs the
    directory the user named held (torchrun's layout puts each run in a directory of its own)."""

    root: Path
    layout: LogLayout
    runs: int = 1

    def attempts(self) -> list[int]:
        return _attempts(self.root)

    def workers(self, attempt: int) -> list[str]:
        """The workers with logs in ``attempt`` (numeric names in numeric order)."""
        folder = self.root / f"attempt_{attempt}"
        if self.layout == LogLayout.TORCHRUN:
            names = [p.name for p in folder.iterdir() if p.is_dir()]
        else:
            names = [p.stem for p in folder.glob("*.log")]
        return sorted(names, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n))

    def files(self, attempt: int, name: str) -> list[Path]:
        folder = self.root / f"attempt_{attempt}"
        if self.layout == LogLayout.TORCHRUN:
            return [folder / name / stream for stream in _STREAM_FILES]
        return [folder / f"{name}.log"]

    @property
    def stamped(self) -> bool:
        return self.layout == LogLayout.XPULAUNCH


def open_run(path: Path) -> RunLogs:
    """The run whose logs are in ``path``: a run's directory, or a torchrun-layout
    ``--log-dir`` holding ``<run_id>_<random>`` runs (the latest is read); else one line."""
    try:
        return _open_run(path)
    except OSError as exc:  # a folder closed to us, a name too long...
        where = os.path.abspath(exc.filename) if exc.filename else path
        raise UsageError(
            f"{where}: cannot read it ({exc.strerror or exc}); give the --log-dir of a run"
        ) from exc


def _open_run(path: Path) -> RunLogs:
    if not path.is_dir():
        raise UsageError(f"{path}: no such directory; give the --log-dir of a run")
    if _attempts(path, must=False):
        return RunLogs(path, _layout(path))
    # A directory holding runs: torchrun's layout puts each in one of its own, and the
    # directory a user runs ``xpulaunch logs`` in may hold the --log-dir of ours (./logs).
    runs = [p for p in path.iterdir() if p.is_dir() and _attempts(p, must=False)]
    if not runs:
        raise UsageError(f"{path}: no attempt_N directories; give the --log-dir of a run")
    latest = max(runs, key=lambda p: (p.stat().st_mtime, p.name))
    return RunLogs(latest, _layout(latest), runs=len(runs))


def _attempts(folder: Path, *, must: bool = True) -> list[int]:
    found = sorted(int(m.group(1)) for p in folder.iterdir() if (m := _ATTEMPT.match(p.name)))
    if not found and must:
        raise UsageError(f"{folder}: no attempt_N directories; give the --log-dir of a run")
    return found


def _layout(root: Path) -> LogLayout:
    """torchrun's when an attempt holds a folder per worker; ours holds files."""
    for attempt in _attempts(root):
        if any(p.is_dir() for p in (root / f"attempt_{attempt}").iterdir()):
            return LogLayout.TORCHRUN
    return LogLayout.XPULAUNCH


def run_ended(run_dir: Path) -> bool:
    """Is the run over: its directory gone, its supervisor gone (the running lock is free),
    or, for a run without that lock (an older version), its ``summary.json`` written?"""
    if not run_dir.is_dir():
        return True
    try:
        fd = os.open(run_dir / RUNNING_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return (run_dir / SUMMARY_FILE).exists()
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False  # its supervisor holds it: running
        return (run_dir / SUMMARY_FILE).exists()  # no working flock here
    finally:
        os.close(fd)  # drops our shared lock, if we got it
    return True


def open_log(path: Path) -> int | None:
    """A log file opened for reading; None when it does not exist (yet). Anything but a
    regular file (a FIFO, a device, a link to one) is a one-line UsageError: reading it
    could block for ever or never end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(
            f"{path}: not a regular file (a FIFO, a device, or a link to one); "
            "xpulaunch logs reads only the log files a run wrote"
        )
    return fd


@dataclass
class LogFollower:
    """New whole lines of several log files (``(worker, path)`` pairs) since the last
    :meth:`lines`. ``stamped``: every line starts with its time stamp (our layout)."""

    files: list[tuple[str, Path]]
    stamped: bool = True
    _offsets: dict[Path, tuple[int, int]] = field(default_factory=dict)  # (inode, bytes read)
    _partial: dict[Path, bytes] = field(default_factory=dict)

    def lines(self) -> Iterator[tuple[str, bytes]]:
        """(worker, line) pairs, read as they are yielded: merged in time-stamp order across
        files when stamped (a k-way merge of the streams), else file after file (torchrun's
        files carry no time to merge by)."""
        streams = [self._stream(name, path) for name, path in self.files]
        if not self.stamped:
            for stream in streams:
                yield from stream
            return
        yield from heapq.merge(*streams, key=lambda pair: pair[1][:_STAMP_BYTES])

    def read(self) -> list[tuple[str, bytes]]:
        """:meth:`lines` as a list (for small logs and tests)."""
        return list(self.lines())

    def _stream(self, name: str, path: Path) -> Iterator[tuple[str, bytes]]:
        fd = open_log(path)
        if fd is None:
            return
        now = os.fstat(fd)
        with contextlib.closing(os.fdopen(fd, "rb")) as handle:
            handle.seek(self._resume_at(path, now))
            rest = self._partial.pop(path, b"")
            while chunk := handle.read(_READ_BYTES):
                self._offsets[path] = (now.st_ino, handle.tell())
                pieces = (rest + chunk).split(b"\n")
                rest = pieces.pop()
                for line in pieces:
                    yield name, line
                while len(rest) > _MAX_PIECE_BYTES:  # a line without end: in pieces
                    yield name, rest[:_MAX_PIECE_BYTES]
                    rest = rest[_MAX_PIECE_BYTES:]
            if rest:
                self._partial[path] = rest  # a line still being written

    def _resume_at(self, path: Path, now: os.stat_result) -> int:
        """Where reading ``path`` goes on: where it stopped, unless the file was rotated
        (another file now has its name) or truncated (``logrotate``'s ``copytruncate``, ``:
        > 0.log``): then from its start, as ``tail -F`` does, not from the middle of a line."""
        inode, offset = self._offsets.get(path, (now.st_ino, 0))
        if inode != now.st_ino or now.st_size < offset:
            self._partial.pop(path, None)  # the end of a line of the file that is gone
            return 0
        return offset
