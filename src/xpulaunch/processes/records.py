"""The last-resort record of a job's processes, swept by the next start.

Normally the supervisor stops its workers, or the guardian kills them when the supervisor
dies. If both die (a host-wide ``kill -9``, an OOM kill of both), the record file is what is
left: one JSON line for the job (supervisor and guardian identity) and one per started
worker (pid, start ticks, session id). The next supervisor that starts sweeps every record
whose supervisor and guardian are gone: it kills what is left of that job and deletes the
file. Start ticks are compared so that a reused pid is never killed (Unsloth's
``process_lifetime.py`` recipe).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from typing import TYPE_CHECKING

from xpulaunch.processes.procfs import find_job, is_running
from xpulaunch.processes.tree import signal_pid

if TYPE_CHECKING:
    from collections.abc import Mapping


def runtime_dir(env: Mapping[str, str]) -> str:
    """``$XDG_RUNTIME_DIR/xpulaunch``, else ``/tmp/xpulaunch-<uid>``: private to the user."""
    base = env.get("XDG_RUNTIME_DIR")
    # The XDG spec says to ignore a relative XDG_RUNTIME_DIR (it would put job records under
    # whatever the current directory is), as the lock directory does.
    if base and os.path.isabs(base) and os.path.isdir(base):
        return os.path.join(base, "xpulaunch", "jobs")
    return os.path.join(f"/tmp/xpulaunch-{os.getuid()}", "jobs")


def _prepare(directory: str | os.PathLike[str]) -> bool:
    """Create the directory privately; False when it is not safely ours."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        # Its parent (abspath: "jobs" alone has the current directory as parent).
        info = os.stat(os.path.dirname(os.path.abspath(directory)))
    except OSError:
        return False
    # /tmp is shared: a directory someone else created there must not be trusted.
    return info.st_uid == os.getuid()


def _alive(identity: object) -> bool:
    if not isinstance(identity, list) or len(identity) != 2:
        return False
    return is_running(int(identity[0]), int(identity[1]))


class JobRecord:
    """Append-only record of one job; removed when the job ended cleanly.

    One descriptor (``O_APPEND``: each line lands whole at the end), opened once for the
    job's few lines.
    """

    def __init__(
        self, directory: str | os.PathLike[str], job_id: str, header: Mapping[str, object]
    ) -> None:
        self.path: str | None = None
        self._fd: int | None = None
        if _prepare(directory):
            self.path = os.path.join(directory, f"{job_id}.jsonl")
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            except OSError:  # a full or read-only runtime dir: the record is only a last resort
                self.path = None
        self._write({"job": job_id, **header})

    def _write(self, entry: Mapping[str, object]) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, (json.dumps(entry) + "\n").encode())
        except OSError:  # a full runtime dir: keep what is written, for the sweep
            self.close()
            self.path = None

    def add_worker(self, pid: int, start_ticks: int) -> None:
        self._write({"pid": pid, "start": start_ticks})

    def close(self) -> None:
        """Stop writing; the file stays (for the next start's sweep)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        self.close()
        if self.path is not None:
            _unlink(self.path)
            self.path = None


def sweep(directory: str | os.PathLike[str]) -> int:
    """Kill what is left of dead jobs recorded in ``directory``; returns processes killed."""
    killed = 0
    if not _prepare(directory):
        return 0
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".jsonl"))
    except OSError:
        return 0
    for name in names:
        killed += _sweep_one(os.path.join(directory, name))
    return killed


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return  # removed by a sweep or by the guardian just now: what we wanted


def _sweep_one(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as handle:
            entries = [json.loads(line) for line in handle.read().splitlines()]
    except (OSError, ValueError):  # unreadable or half-written: nothing we can trust
        return 0
    if not entries or not isinstance(entries[0], dict):
        return 0
    head = entries[0]
    if _alive(head.get("supervisor")) or _alive(head.get("guardian")):
        return 0  # the job is still looked after
    sessions = {int(e["pid"]): int(e["start"]) for e in entries[1:] if "pid" in e}
    since = int(head.get("since", 0))
    cgroup = _job_cgroup(head.get("cgroup"), str(head.get("job")))
    found = find_job(str(head.get("job")), sessions, since_ticks=since, cgroup=cgroup)
    killed = sum(signal_pid(p.info.pid, signal.SIGKILL) for p in found)
    if cgroup is not None:
        from xpulaunch.processes.cgroup import JobCgroup

        JobCgroup(cgroup).kill()
        JobCgroup(cgroup).remove()
    # The job's private run directory (its workers' error files), if it was left behind.
    shutil.rmtree(path.removesuffix(".jsonl") + ".run", ignore_errors=True)
    _unlink(path)
    return killed


def _job_cgroup(path: object, job_id: str) -> str | None:
    """The recorded cgroup, if it is one of ours (a record file is only as trusted as the
    user's runtime directory, but never let it name another cgroup to kill)."""
    if not isinstance(path, str) or os.path.basename(path) != f"xpulaunch-{job_id}":
        return None
    return path if os.path.isdir(path) else None
