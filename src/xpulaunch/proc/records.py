"""The last-resort record of a job's processes, swept by the next start.

Normally the supervisor stops its workers, or the guardian kills them when the supervisor
dies. If both die (a host-wide ``kill -9``, an OOM kill of both), the record file is what is
left: one JSON line for the job (supervisor and guardian identity) and one per started
worker (pid, start ticks, session id). The next supervisor that starts sweeps every record
whose supervisor and guardian are gone: it kills what is left of that job and deletes the
file. Start ticks are compared so that a reused pid is never killed (Unsloth's
``process_lifetime.py`` recipe; landscape.md (c) 14).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path

from xpulaunch.proc.guardian import find_job, read_stat
from xpulaunch.proc.tree import signal_pid


def runtime_dir(env: Mapping[str, str]) -> Path:
    """``$XDG_RUNTIME_DIR/xpulaunch``, else ``/tmp/xpulaunch-<uid>``: private to the user."""
    base = env.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        return Path(base) / "xpulaunch" / "jobs"
    return Path(f"/tmp/xpulaunch-{os.getuid()}") / "jobs"


def _prepare(directory: Path) -> bool:
    """Create the directory privately; False when it is not safely ours."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.parent.stat()
    except OSError:
        return False
    # /tmp is shared: a directory someone else created there must not be trusted.
    return info.st_uid == os.getuid()


def _alive(identity: object) -> bool:
    if not isinstance(identity, list) or len(identity) != 2:
        return False
    info = read_stat(int(identity[0]))
    return info is not None and info.start_ticks == int(identity[1]) and info.state not in "ZX"


class JobRecord:
    """Append-only record of one job; removed when the job ended cleanly."""

    def __init__(self, directory: Path, job_id: str, header: Mapping[str, object]) -> None:
        self.path: Path | None = directory / f"{job_id}.jsonl" if _prepare(directory) else None
        self._write({"job": job_id, **header})

    def _write(self, entry: Mapping[str, object]) -> None:
        if self.path is None:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry) + "\n")
        except OSError:  # a full or read-only runtime dir: the record is only a last resort
            self.path = None

    def add_worker(self, pid: int, start_ticks: int) -> None:
        self._write({"pid": pid, "start": start_ticks})

    def remove(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


def sweep(directory: Path) -> int:
    """Kill what is left of dead jobs recorded in ``directory``; returns processes killed."""
    killed = 0
    if not _prepare(directory):
        return 0
    try:
        files = sorted(directory.glob("*.jsonl"))
    except OSError:
        return 0
    for path in files:
        killed += _sweep_one(path)
    return killed


def _sweep_one(path: Path) -> int:
    try:
        entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, ValueError):  # unreadable or half-written: nothing we can trust
        return 0
    if not entries or not isinstance(entries[0], dict):
        return 0
    head = entries[0]
    if _alive(head.get("supervisor")) or _alive(head.get("guardian")):
        return 0  # the job is still looked after
    sessions = {int(e["pid"]): int(e["start"]) for e in entries[1:] if "pid" in e}
    since = int(head.get("since", 0))
    members = find_job(str(head.get("job")), sessions, since_ticks=since)
    killed = sum(signal_pid(m.info.pid, signal.SIGKILL) for m in members)
    path.unlink(missing_ok=True)
    return killed
