"""Reading a run's ``--log-dir`` back: its attempts, its workers' files, new lines as they come.

The layout is :mod:`xpulaunch.proc.logs`' (``attempt_<n>/<name>.log``, each line starting with
its UTC time stamp) plus ``summary.json``, written when the run ends.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from pathlib import Path

from xpulaunch.errors import UsageError
from xpulaunch.proc.run_summary import FILE_NAME as SUMMARY_FILE

_ATTEMPT = re.compile(r"^attempt_(\d+)$")
_STAMP_BYTES = 25  # "2026-11-23T23:32:13.123Z "


def attempts(run_dir: Path) -> list[int]:
    """The attempt numbers of a run directory, in order; a one-line error if it is none."""
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such directory; give the --log-dir of a run")
    found = sorted(int(m.group(1)) for p in run_dir.iterdir() if (m := _ATTEMPT.match(p.name)))
    if not found:
        raise UsageError(f"{run_dir}: no attempt_N directories; give the --log-dir of a run")
    return found


def worker_names(run_dir: Path, attempt: int) -> list[str]:
    """The workers with a log file in ``attempt`` (numeric names in numeric order)."""
    names = [p.stem for p in (run_dir / f"attempt_{attempt}").glob("*.log")]
    return sorted(names, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n))


def run_ended(run_dir: Path) -> bool:
    return (run_dir / SUMMARY_FILE).exists()


@dataclass
class LogFollower:
    """New whole lines of several workers' log files since the last :meth:`read`."""

    files: dict[str, Path]
    _offsets: dict[str, int] = field(default_factory=dict)
    _partial: dict[str, bytes] = field(default_factory=dict)

    def read(self) -> list[tuple[str, bytes]]:
        """(worker, line) pairs, merged in time-stamp order across workers."""
        per_worker = [[(line[:_STAMP_BYTES], name, line) for line in self._new_lines(name, path)]
                      for name, path in self.files.items()]  # fmt: skip
        return [(name, line) for _, name, line in heapq.merge(*per_worker)]

    def _new_lines(self, name: str, path: Path) -> list[bytes]:
        try:
            with open(path, "rb") as handle:
                handle.seek(self._offsets.get(name, 0))
                data = handle.read()
        except FileNotFoundError:
            return []
        self._offsets[name] = self._offsets.get(name, 0) + len(data)
        data = self._partial.pop(name, b"") + data
        lines = data.split(b"\n")
        if lines[-1]:
            self._partial[name] = lines[-1]  # a line still being written
        return lines[:-1]
