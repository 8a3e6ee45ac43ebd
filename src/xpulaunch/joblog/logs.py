"""Worker output: whole prefixed lines on the console, one log file per worker and attempt.

The supervisor's loop thread reads every worker's pipes and hands complete lines to one
:class:`LogSink`, which writes each batch with a single ``write`` under a lock. So a line is
never cut by another worker's output (the honcho printer idea), also when workers print long
lines fast. A line longer than ``MAX_LINE_BYTES`` without a newline is emitted in pieces so
that a runaway writer cannot make the supervisor grow without bound.

Two layouts of ``log_dir`` (:class:`LogLayout`), ``n`` counting from 0 in both:

- ours: ``<log_dir>/attempt_<n>/<name>.log`` holding the worker's stdout and stderr as written.
  Each line starts with the time it was read, ``2026-11-23T23:32:13.123Z`` (UTC) and a space,
  so that a hang or a slow step can be placed in time afterwards.
- torchrun's (``torch/distributed/elastic/multiprocessing/api.py``, ``DefaultLogsSpecs``):
  ``log_dir`` is the run's own directory, ``<dir>/<run_id>_<random>`` (:func:`make_run_log_dir`),
  holding ``attempt_<n>/<local_rank>/stdout.log``, ``stderr.log`` and the worker's
  ``error.json``. The lines are exactly what the worker wrote, as in torchrun's files.

Only ``attempt_0`` and the last ``KEEP_ATTEMPTS`` attempts are kept. The console keeps the
plain ``[name]`` prefix.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, cast

from xpulaunch.core.units import iso_utc
from xpulaunch.errors import UsageError
from xpulaunch.joblog.console import Console, append_whole

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import BinaryIO


MAX_LINE_BYTES = 64 * 1024
RUNNING_LOCK = ".running.lock"  # locked by the supervisor while the run runs (log_reader)
KEEP_ATTEMPTS = 20  # besides attempt_0
# Cyan, yellow, green, magenta, blue, bright cyan ... red stays free for errors.
_COLOURS = (b"36", b"33", b"32", b"35", b"34", b"96", b"93", b"92", b"95", b"94")
_RESET = b"\x1b[0m"


class LogLayout(str, Enum):
    """How ``log_dir`` is laid out (see the module's docstring)."""

    XPULAUNCH = "xpulaunch"
    TORCHRUN = "torchrun"


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Where worker output goes.

    ``console_names``: workers shown on the console (``--ranks 0,2``); None shows all. Log
    files and :meth:`Supervisor.tail` always get every worker. ``color`` None means: colour
    on a terminal unless ``NO_COLOR`` is set (https://no-color.org). ``layout``: how
    ``log_dir`` is laid out; with ``LogLayout.TORCHRUN`` it is the run's own directory.
    """

    log_dir: str | os.PathLike[str] | None = None
    layout: LogLayout = LogLayout.XPULAUNCH
    console: bool = True
    console_names: frozenset[str] | None = None
    color: bool | None = None
    prefix: bool = True
    tail_lines: int = 200


class LineBuffer:
    """Split a byte stream into complete lines, keeping the unfinished rest."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        data = self._rest + data
        lines = data.split(b"\n")
        self._rest = lines.pop()
        while len(self._rest) > MAX_LINE_BYTES:
            lines.append(self._rest[:MAX_LINE_BYTES])
            self._rest = self._rest[MAX_LINE_BYTES:]
        return lines

    def flush(self) -> list[bytes]:
        rest, self._rest = self._rest, b""
        return [rest] if rest else []


def _wants_colour(config: LogConfig, stream: BinaryIO) -> bool:
    if config.color is not None:
        return config.color
    # Reading (never writing) our own environment: NO_COLOR is about this terminal.
    return not os.environ.get("NO_COLOR") and stream.isatty()


def make_log_dir(value: str | None) -> str | None:
    """Create ``--log-dir`` at once, so that a bad one fails before any device is leased."""
    if value is None:
        return None
    try:
        os.makedirs(value, exist_ok=True)
        if not os.access(value, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise UsageError(
            f"--log-dir {value}: cannot create or write it ({exc.strerror}); "
            "give a writable directory"
        ) from exc
    return value


def make_run_log_dir(
    log_dir: str | None, layout: LogLayout, run_id: str | None = None
) -> str | None:
    """The directory a run writes its logs (and ``summary.json``) into: ``log_dir`` itself;
    in torchrun's layout a new ``<log_dir>/<run_id>_<random>``, as torchrun's
    ``DefaultLogsSpecs`` makes it (``run_id``: the rendezvous id, torchrun's default
    ``none``). ``log_dir`` must exist (:func:`make_log_dir`)."""
    if log_dir is None or layout == LogLayout.XPULAUNCH:
        return log_dir
    import tempfile  # only here: not on the launch path of our own layout

    try:
        return tempfile.mkdtemp(prefix=f"{run_id or 'none'}_", dir=log_dir)
    except OSError as exc:
        raise UsageError(
            f"--log-dir {log_dir}: cannot create the run's directory there "
            f"({exc.strerror or exc}); give a writable directory"
        ) from exc


def rank_folders(envs: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """Each worker's folder in torchrun's layout (``envs``: name -> environment): its
    ``LOCAL_RANK``, else (a worker that has none, as ``Supervisor`` users may give) its name."""
    return {name: env.get("LOCAL_RANK", name) for name, env in envs.items()}


def log_stamp(wall_s: float) -> bytes:
    """``2026-11-23T23:32:13.123Z `` for a log file line read at ``wall_s``."""
    return iso_utc(wall_s).encode() + b" "


class LogSink:
    """Thread-safe writer for every worker's lines, plus a tail of each worker's output."""

    def __init__(
        self,
        config: LogConfig,
        names: Sequence[str],
        *,
        out: BinaryIO | None = None,
        err: BinaryIO | None = None,
        wall_clock: Callable[[], float] = time.time,
        folders: Mapping[str, str] | None = None,
    ) -> None:
        """``folders``: each worker's folder in torchrun's layout, its local rank (see
        :func:`rank_folders`); default its name."""
        self._config = config
        self._folders = {n: (folders or {}).get(n, n) for n in names}
        self._wall_clock = wall_clock
        err_stream = err or _std_stream(sys.stderr)
        # Each stream that fails (a full disk, an I/O error) is reported on the other one.
        out_stream = out or _std_stream(sys.stdout)
        self._out = Console(out_stream, on_error=self._console_failed("stdout"))
        self._err = Console(err_stream, on_error=self._console_failed("stderr"))
        self._lock = threading.Lock()
        self._running_lock: int | None = None  # see hold_running_lock
        self._files: dict[str, dict[bool, BinaryIO]] = {}  # a worker's file per is_err
        self._paths: dict[str, Path] = {}
        # Per worker: (line number, is stderr, text); numbers let a tail start at an attempt.
        self._tails = {n: deque[tuple[int, bool, str]](maxlen=config.tail_lines) for n in names}
        self._count = dict.fromkeys(names, 0)
        width = max((len(n) for n in names), default=1)
        colour = _wants_colour(config, err_stream)
        self._prefix = {n: self._make_prefix(n, i, width, colour) for i, n in enumerate(names)}

    def _make_prefix(self, name: str, index: int, width: int, colour: bool) -> bytes:
        if not self._config.prefix:
            return b""
        tag = f"[{name}]".ljust(width + 2).encode()
        if colour:
            tag = b"\x1b[" + _COLOURS[index % len(_COLOURS)] + b"m" + tag + _RESET
        return tag + b" "

    def open_attempt(self, name: str, attempt: int) -> Path | None:
        """Start the log files of ``name``'s attempt ``attempt`` (closing the previous ones);
        their place: see :meth:`log_path`."""
        if self._config.log_dir is None:
            return None
        if self._running_lock is None:
            self._running_lock = hold_running_lock(self._config.log_dir)
        where = self._where(name, attempt)
        handles: dict[bool, BinaryIO] | None = None
        try:
            handles = self._open(where)
        except OSError as exc:
            with self._lock:
                self._log_failed(where, exc)
        with self._lock:
            old = self._files.pop(name, {})
            if handles is not None:
                self._files[name], self._paths[name] = handles, where
        for handle in old.values():  # one handle twice in our layout: closing again is a no-op
            _close_quietly(handle)
        self._prune(name, attempt)
        return where if handles is not None else None

    def _where(self, name: str, attempt: int) -> Path:
        """Our layout: the worker's log file; torchrun's: the worker's folder."""
        attempt_dir = Path(self._config.log_dir or ".") / f"attempt_{attempt}"
        if self._config.layout == LogLayout.TORCHRUN:
            return attempt_dir / self._folders[name]
        return attempt_dir / f"{name}.log"

    def _open(self, where: Path) -> dict[bool, BinaryIO]:
        """The file of each stream (keyed by ``is_err``), kept open for the attempt."""
        if self._config.layout == LogLayout.XPULAUNCH:
            where.parent.mkdir(parents=True, exist_ok=True)
            handle = open(where, "ab", buffering=0)  # noqa: SIM115 (kept open for the attempt)
            return {False: handle, True: handle}
        where.mkdir(parents=True, exist_ok=True)
        out = open(where / "stdout.log", "ab", buffering=0)  # noqa: SIM115 (as above)
        try:
            return {False: out, True: open(where / "stderr.log", "ab", buffering=0)}
        except OSError:
            _close_quietly(out)
            raise

    def error_file(self, run_dir: Path, name: str, attempt: int) -> Path:
        """Where ``name``'s attempt ``attempt`` gets its ``TORCHELASTIC_ERROR_FILE``: in
        torchrun's layout its ``error.json`` beside its logs, as torchrun puts it; else
        ``attempt_<n>/<name>.error.json`` under ``run_dir`` (the log dir, or a private one)."""
        if self._config.layout == LogLayout.TORCHRUN and self._config.log_dir is not None:
            return self._where(name, attempt) / "error.json"
        return run_dir / f"attempt_{attempt}" / f"{name}.error.json"

    def _prune(self, name: str, attempt: int) -> None:
        """Keep ``attempt_0`` (the first failure) and the last :data:`KEEP_ATTEMPTS`
        attempts of a worker's logs: a crash loop must not fill the disk with directories."""
        old = attempt - KEEP_ATTEMPTS
        if old < 1 or self._config.log_dir is None:
            return
        gone = self._where(name, old)
        if self._config.layout == LogLayout.TORCHRUN:
            shutil.rmtree(gone, ignore_errors=True)  # the worker's folder: logs, error.json
        else:
            with contextlib.suppress(OSError):  # gone already, or not ours to remove
                gone.unlink()
        with contextlib.suppress(OSError):  # other workers' logs are still there
            gone.parent.rmdir()

    def log_path(self, name: str) -> Path | None:
        """The log file of ``name``'s current attempt; in torchrun's layout, its folder
        (``stdout.log``, ``stderr.log``, ``error.json``)."""
        with self._lock:
            return self._paths.get(name)

    def write(self, name: str, is_err: bool, lines: Sequence[bytes]) -> None:
        """Write complete lines of one worker stream (without their newlines)."""
        if not lines:
            return
        shown = self._config.console and (
            self._config.console_names is None or name in self._config.console_names
        )
        with self._lock:
            first = self._count[name]
            self._count[name] = first + len(lines)
            texts = (line.decode(errors="replace") for line in lines)
            self._tails[name].extend((first + i, is_err, text) for i, text in enumerate(texts))
            handles = self._files.get(name)
            if handles is not None:
                stamp = self._stamp()
                data = b"".join(stamp + line + b"\n" for line in lines)
                self._write_file(name, handles[is_err], data)
            if shown:
                prefix = self._prefix[name]
                self._console(is_err, b"".join(prefix + line + b"\n" for line in lines))

    def _stamp(self) -> bytes:
        """Our layout stamps each line; torchrun's files hold exactly what the worker wrote
        (tools grep and parse them as such)."""
        if self._config.layout == LogLayout.TORCHRUN:
            return b""
        return log_stamp(self._wall_clock())

    def _write_file(self, name: str, handle: BinaryIO, data: bytes) -> None:
        """Append to a log file; a full disk or an I/O error only ends that worker's files
        (with one warning): log files are a convenience, supervision and the console go on.
        A short write writes the rest; a failed one leaves the file ending in a whole line."""
        try:
            append_whole(handle.fileno(), data)
        except OSError as exc:
            for dropped in self._files.pop(name).values():
                _close_quietly(dropped)
            self._log_failed(self._paths[name], exc)

    def _log_failed(self, path: Path, exc: OSError) -> None:
        text = f"xpulaunch: warning: log file {path}: {exc.strerror or exc}; no longer written\n"
        self._console(True, text.encode())

    def message(self, text: str) -> None:
        """One line of the supervisor's own (summary, restarts) on the error stream."""
        if self._config.console:
            with self._lock:
                self._console(True, f"xpulaunch: {text}\n".encode())

    def _console(self, is_err: bool, data: bytes) -> None:
        """Never blocks: see :mod:`xpulaunch.joblog.console` (a reader that went away only
        ends that stream; supervision and the log files go on)."""
        (self._err if is_err else self._out).write(data)

    def _console_failed(self, name: str) -> Callable[[OSError], None]:
        def report(exc: OSError) -> None:
            other = self._err if name == "stdout" else self._out
            text = f"xpulaunch: warning: {name}: {exc.strerror or exc}; no longer written\n"
            other.write(text.encode())

        return report

    def mark(self, name: str) -> int:
        """The number the next line of ``name`` will get (for ``tail(since=...)``)."""
        with self._lock:
            return self._count[name]

    def tail(
        self, name: str, lines: int = 20, *, stderr_only: bool = False, since: int = 0
    ) -> list[str]:
        """The last ``lines`` lines of ``name`` (only stderr; only from line ``since`` on)."""
        with self._lock:
            kept = [
                text
                for number, is_err, text in self._tails[name]
                if number >= since and (is_err or not stderr_only)
            ]
        return kept[-lines:] if lines > 0 else []

    def close(self) -> None:
        with self._lock:
            files, self._files = list(self._files.values()), {}
        for handles in files:
            for handle in handles.values():
                _close_quietly(handle)
        if self._running_lock is not None:
            os.close(self._running_lock)  # the run is over for `xpulaunch logs -f`
            self._running_lock = None
        self._out.close()
        dropped = self._out.dropped_lines_total
        if dropped:
            self.message(f"{dropped} lines of output dropped: the console was not reading")
        self._err.close()


def hold_running_lock(run_dir: str | os.PathLike[str]) -> int | None:
    """Lock ``RUNNING_LOCK`` in ``run_dir`` for as long as the returned descriptor stays open
    (the supervisor's, close-on-exec: no worker holds it). None where it cannot be locked
    (then followers wait for ``summary.json``)."""
    path = os.path.join(run_dir, RUNNING_LOCK)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # another run of the same directory holds it, or no flock here
        os.close(fd)
        return None
    return fd


def remove_running_lock(run_dir: str | os.PathLike[str]) -> None:
    """Remove ``RUNNING_LOCK`` from a run's directory once its run is over and its
    ``summary.json`` written (a follower then knows the run ended by that file): it was left
    in every ``--log-dir``. Kept where another run holds it, or where it cannot be locked."""
    path = os.path.join(run_dir, RUNNING_LOCK)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return  # never made (a run without flock), or gone already
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(path)  # locked: no run holds it, and none takes it before it is gone
    except OSError:
        pass  # another run of this directory holds it: it is that run's to remove
    finally:
        os.close(fd)


def _std_stream(stream: object) -> BinaryIO:
    """``sys.stdout.buffer``, or ``/dev/null`` where Python started without that stream (a
    descriptor closed with ``>&-`` in a program embedding the supervisor)."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        return open(os.devnull, "wb")
    return cast("BinaryIO", buffer)


def _close_quietly(handle: BinaryIO) -> None:
    """Close a log file; unbuffered, so nothing is left to flush (and lost) but the close."""
    with contextlib.suppress(OSError):  # NFS may report a failed write-back only at close
        handle.close()
