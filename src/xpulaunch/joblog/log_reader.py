"""Reading a run's ``--log-dir`` back: its attempts, its workers' files, new lines as they come.

Both layouts of :mod:`xpulaunch.joblog.logs` are read: ours (``attempt_<n>/<name>.log``, each
line starting with its UTC time stamp) and torchrun's (``attempt_<n>/<local_rank>/stdout.log``
and ``stderr.log``, lines as the worker wrote them, in a ``<run_id>_<random>`` directory of
its own); plus ``summary.json``, written into the run's directory when the run ends.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from pathlib import Path

from xpulaunch.errors import UsageError
from xpulaunch.joblog.logs import LogLayout
from xpulaunch.joblog.run_summary import FILE_NAME as SUMMARY_FILE

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
    if not path.is_dir():
        raise UsageError(f"{path}: no such directory; give the --log-dir of a run")
    if _attempts(path, must=False):
        return RunLogs(path, _layout(path))
    runs = [p for p in path.iterdir() if p.is_dir() and _attempts(p, must=False)]
    if not runs:
        raise UsageError(f"{path}: no attempt_N directories; give the --log-dir of a run")
    latest = max(runs, key=lambda p: (p.stat().st_mtime, p.name))
    return RunLogs(latest, LogLayout.TORCHRUN, runs=len(runs))


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
    return (run_dir / SUMMARY_FILE).exists()


@dataclass
class LogFollower:
    """New whole lines of several log files (``(worker, path)`` pairs) since the last
    :meth:`read`. ``stamped``: every line starts with its time stamp (our layout)."""

    files: list[tuple[str, Path]]
    stamped: bool = True
    _offsets: dict[Path, int] = field(default_factory=dict)
    _partial: dict[Path, bytes] = field(default_factory=dict)

    def read(self) -> list[tuple[str, bytes]]:
        """(worker, line) pairs: merged in time-stamp order across files when stamped, else
        file after file (torchrun's files carry no time to merge by)."""
        per_file = [[(name, line) for line in self._new_lines(path)] for name, path in self.files]
        if not self.stamped:
            return [pair for lines in per_file for pair in lines]
        return list(heapq.merge(*per_file, key=lambda pair: pair[1][:_STAMP_BYTES]))

    def _new_lines(self, path: Path) -> list[bytes]:
        try:
            with open(path, "rb") as handle:
                handle.seek(self._offsets.get(path, 0))
                data = handle.read()
        except FileNotFoundError:
            return []
        self._offsets[path] = self._offsets.get(path, 0) + len(data)
        data = self._partial.pop(path, b"") + data
        lines = data.split(b"\n")
        if lines[-1]:
            self._partial[path] = lines[-1]  # a line still being written
        return lines[:-1]
