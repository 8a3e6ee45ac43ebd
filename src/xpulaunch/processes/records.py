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

import contextlib
import json
import os
import shutil
import signal
from typing import TYPE_CHECKING

from xpulaunch.processes.procfs import find_job, is_running
from xpulaunch.processes.signals import signal_pid

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
    pid, ticks = identity
    return isinstance(pid, int) and isinstance(ticks, int) and is_running(pid, ticks)


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

    def add_guardian(self, identity: list[int]) -> None:
        """A new guardian looks after the job (the first one died)."""
        self._write({"guardian": identity})

    def close(self) -> None:
        """Stop writing; the file stays (for the next start's sweep)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        self.close()
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):  # removed by a sweep or the guardian
                os.unlink(self.path)
            self.path = None


def run_dir_of(record: str) -> str:
    """The job's private run directory beside its record (``<job>.run`` for ``<job>.jsonl``)."""
    return record.removesuffix(".jsonl") + ".run"


def read_entries(path: str) -> list[dict[str, object]]:
    """The record's JSON lines (a line cut short by a death is skipped); [] if unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, ValueError):
        return []
    entries = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def recorded_workers(path: str) -> dict[int, int]:
    """Every worker the record names: pid (its session id) -> start ticks."""
    workers = {}
    for entry in read_entries(path)[1:]:
        pid, ticks = entry.get("pid"), entry.get("start")
        if isinstance(pid, int) and isinstance(ticks, int):
            workers[pid] = ticks
    return workers


def sweep(directory: str | os.PathLike[str]) -> int:
    """Kill what is left of dead jobs recorded in ``directory``; returns processes killed."""
    if not _prepare(directory):
        return 0
    try:
        names = set(os.listdir(directory))
    except OSError:
        return 0
    records = sorted(n for n in names if n.endswith(".jsonl"))
    killed = sum(_sweep_one(os.path.join(directory, name)) for name in records)
    # A private run directory without its record: its job is over (the record is written
    # before the run directory is made, and removed after it), but the directory was left
    # (an old version's guardian, a kill -9 of both).
    for name in names:
        if name.endswith(".run") and name.removesuffix(".run") + ".jsonl" not in names:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    return killed


def _sweep_one(path: str) -> int:
    entries = read_entries(path)
    if not entries or "job" not in entries[0]:
        return 0  # unreadable, or not a record of ours: nothing we can trust
    head = entries[0]
    guardians = [head.get("guardian"), *(e.get("guardian") for e in entries[1:])]
    if _alive(head.get("supervisor")) or any(_alive(g) for g in guardians):
        return 0  # the job is still looked after
    sessions = recorded_workers(path)
    recorded_since = head.get("since")
    since = recorded_since if isinstance(recorded_since, int) else 0
    cgroup = _job_cgroup(head.get("cgroup"), str(head.get("job")))
    found = find_job(str(head.get("job")), sessions, since_ticks=since, cgroup=cgroup)
    killed = sum(signal_pid(p.info.pid, signal.SIGKILL) for p in found)
    if cgroup is not None:
        from xpulaunch.processes.cgroup import JobCgroup

        JobCgroup(cgroup).kill()
        JobCgroup(cgroup).remove()
    # The job's private run directory (its workers' error files), if it was left behind.
    shutil.rmtree(run_dir_of(path), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):  # removed by the guardian just now
        os.unlink(path)
    return killed


def _job_cgroup(path: object, job_id: str) -> str | None:
    """The recorded cgroup, if it is one of ours (a record file is only as trusted as the
    user's runtime directory, but never let it name another cgroup to kill)."""
    if not isinstance(path, str) or os.path.basename(path) != f"xpulaunch-{job_id}":
        return None
    return path if os.path.isdir(path) else None
