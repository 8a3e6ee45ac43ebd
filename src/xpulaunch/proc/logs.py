"""Worker output: whole prefixed lines on the console, one log file per worker and attempt.

The supervisor's loop thread reads every worker's pipes and hands complete lines to one
:class:`LogSink`, which writes each batch with a single ``write`` under a lock. So a line is
never cut by another worker's output (the honcho printer idea), also when workers print long
lines fast. A line longer than ``MAX_LINE_BYTES`` without a newline is emitted in pieces so
that a runaway writer cannot make the supervisor grow without bound.

Layout with ``log_dir``: ``<log_dir>/attempt_<n>/<name>.log`` holding the worker's stdout and
stderr as written, ``n`` counting from 0 like torchrun's ``attempt_<n>``. Only ``attempt_0``
and the last ``KEEP_ATTEMPTS`` attempts are kept. Each line of a log file starts with the time
it was read, ``2026-11-23T23:32:13.123Z`` (UTC) and a space, so that a hang or a slow step can
be placed in time afterwards; the console keeps the plain ``[name]`` prefix.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xpulaunch.core.units import iso_utc
from xpulaunch.proc.console import Console

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import BinaryIO

MAX_LINE_BYTES = 64 * 1024
KEEP_ATTEMPTS = 20  # besides attempt_0
# Cyan, yellow, green, magenta, blue, bright cyan ... red stays free for errors.
_COLOURS = (b"36", b"33", b"32", b"35", b"34", b"96", b"93", b"92", b"95", b"94")
_RESET = b"\x1b[0m"


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Where worker output goes.

    ``console_names``: workers shown on the console (``--ranks 0,2``); None shows all. Log
    files and :meth:`Supervisor.tail` always get every worker. ``color`` None means: colour
    on a terminal unless ``NO_COLOR`` is set (https://no-color.org).
    """

    log_dir: str | os.PathLike[str] | None = None
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
    ) -> None:
        self._config = config
        self._wall_clock = wall_clock
        err_stream = err or sys.stderr.buffer
        self._out, self._err = Console(out or sys.stdout.buffer), Console(err_stream)
        self._lock = threading.Lock()
        self._files: dict[str, BinaryIO] = {}
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
        """Start the log file of ``name``'s attempt ``attempt`` (closing the previous one)."""
        if self._config.log_dir is None:
            return None
        path = Path(self._config.log_dir) / f"attempt_{attempt}" / f"{name}.log"
        handle: BinaryIO | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path, "ab", buffering=0)  # noqa: SIM115 (kept open for the attempt)
        except OSError as exc:
            with self._lock:
                self._log_failed(path, exc)
        with self._lock:
            old = self._files.pop(name, None)
            if handle is not None:
                self._files[name], self._paths[name] = handle, path
        if old is not None:
            _close_quietly(old)
        self._prune(name, attempt)
        return path if handle is not None else None

    def _prune(self, name: str, attempt: int) -> None:
        """Keep ``attempt_0`` (the first failure) and the last :data:`KEEP_ATTEMPTS`
        attempts of a worker's logs: a crash loop must not fill the disk with directories."""
        old = attempt - KEEP_ATTEMPTS
        if old < 1 or self._config.log_dir is None:
            return
        folder = Path(self._config.log_dir) / f"attempt_{old}"
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            (folder / f"{name}.log").unlink()
        with contextlib.suppress(OSError):  # other workers' logs are still there
            folder.rmdir()

    def log_path(self, name: str) -> Path | None:
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
            handle = self._files.get(name)
            if handle is not None:
                stamp = log_stamp(self._wall_clock())
                data = b"".join(stamp + line + b"\n" for line in lines)
                self._write_file(name, handle, data)
            if shown:
                prefix = self._prefix[name]
                self._console(is_err, b"".join(prefix + line + b"\n" for line in lines))

    def _write_file(self, name: str, handle: BinaryIO, data: bytes) -> None:
        """Append to a log file; a full disk or an I/O error only ends that file (with one
        warning): log files are a convenience, supervision and the console go on."""
        try:
            handle.write(data)
        except OSError as exc:
            del self._files[name]
            _close_quietly(handle)
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
        """Never blocks: see :mod:`xpulaunch.proc.console` (a reader that went away only
        ends that stream; supervision and the log files go on)."""
        (self._err if is_err else self._out).write(data)

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
        for handle in files:
            _close_quietly(handle)
        self._out.close()
        dropped = self._out.dropped_lines_total
        if dropped:
            self.message(f"{dropped} lines of output dropped: the console was not reading")
        self._err.close()


def _close_quietly(handle: BinaryIO) -> None:
    """Close a log file; unbuffered, so nothing is left to flush (and lost) but the close."""
    with contextlib.suppress(OSError):  # NFS may report a failed write-back only at close
        handle.close()
