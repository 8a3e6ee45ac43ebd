"""One job's process: ``xpulaunch run --wait ...`` started detached by a runner, with its
console in the job's ``output.log`` and its events in ``events.jsonl``.

The job is an ordinary supervised run in a session of its own, so it outlives its runner
(``kill -9`` included): its leases, guardian and workers are the run's, not the runner's.
The next runner adopts it by ``(pid, start ticks)`` (a reused pid has other ticks) and
watches its end through a pidfd; since only a parent can read an exit status, an adopted
job's status comes from its run's own ``stopped`` event.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from xpulaunch.errors import QueueError
from xpulaunch.jobqueue.files import OUTPUT_NAME, JobSpec, job_env, job_folder
from xpulaunch.jobqueue.policy import Job
from xpulaunch.leases.lock_directory import LockDirectory
from xpulaunch.processes import procfs
from xpulaunch.processes.signals import signal_name
from xpulaunch.processes.spawn import open_pidfd

_MAX_EVENT_BYTES = 1024 * 1024
_ERROR_PREFIX = "xpulaunch: error: "


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job's run ended: its exit status (None: unknown) and why, in a few words."""

    exit_code: int | None
    reason: str


@dataclass
class EventsTail:
    """New JSON lines of a run's ``--events`` file since the last :meth:`read`."""

    path: str
    offset: int = 0
    partial: bytes = b""

    def read(self) -> list[dict[str, object]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read(_MAX_EVENT_BYTES)
        except OSError:
            return []  # not written yet
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        records = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # not an event line (a file the user shares with something else)
            if isinstance(record, dict):
                records.append(record)
        return records


@dataclass
class JobProcess:
    """A job's run: our child (``popen``), or adopted from an earlier runner."""

    job_id: int
    pid: int
    ticks: int | None
    events: EventsTail
    output: Path
    popen: subprocess.Popen[bytes] | None = None
    pidfd: int | None = None
    stopped: dict[str, object] | None = field(default=None)
    leased: bool = False  # its run holds its devices
    waiting: bool = False  # its run waits in the lease line
    ended_s: float | None = None  # wall-clock time its end was first seen
    unrecorded: dict[str, object] | None = None  # its lease event, not yet in its record

    def ended(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is not None
        return self.ticks is None or not procfs.is_running(self.pid, self.ticks)

    def outcome(self) -> Outcome:
        """Once :meth:`ended`: its exit status and how it ended."""
        if self.stopped is not None:
            code = self.stopped.get("exit_code")
            reason = self.stopped.get("reason")
            if isinstance(code, int):
                return Outcome(code, str(reason or ""))
        error = last_error(self.output)
        if self.popen is not None and self.popen.returncode is not None:
            code = self.popen.returncode
            if code < 0:
                killed = f"its xpulaunch was killed by {signal_name(-code)}"
                return Outcome(128 - code, error or killed)
            return Outcome(code, error or ("" if code == 0 else f"exit status {code}"))
        return Outcome(None, error or "ended while no runner watched it; exit status unknown")

    def signal(self, signum: int) -> bool:
        """Send ``signum`` to the run, if it is still the same process; False when gone."""
        if self.ended():
            return False
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def start(job: Job, spec: JobSpec, directory: LockDirectory) -> JobProcess:
    """Start the job's ``xpulaunch run --wait`` in a session of its own (its folder is the
    one of its owner's that its id names, whatever the database says)."""
    folder = job_folder(directory, job.uid, job.id)
    argv = [spec.python or "python3", "-m", "xpulaunch"]
    if spec.profile:
        argv += ["--profile", spec.profile]
    argv += ["run", "--wait"]
    if directory.shared:
        argv += ["--lock-dir", str(directory.root)]
    if spec.add_events:
        argv += ["--events", spec.events]
    if spec.add_log_dir:
        argv += ["--log-dir", spec.log_dir]
    argv += list(spec.args)
    output = folder / OUTPUT_NAME
    events = _events(spec)  # before the run starts: none of its events is missed
    try:
        with open(output, "ab") as console:
            popen = subprocess.Popen(
                argv,
                cwd=spec.cwd,
                env=dict(job_env(spec, job.id, directory)),
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
    except OSError as exc:
        where = exc.filename or argv[0]
        raise QueueError(f"cannot start the job ({where}: {exc.strerror})") from exc
    return JobProcess(
        job.id,
        popen.pid,
        procfs.start_ticks(popen.pid),
        events,
        output,
        popen=popen,
        pidfd=open_pidfd(popen.pid),
    )


def adopt(job: Job, spec: JobSpec, directory: LockDirectory) -> JobProcess:
    """Watch a job that an earlier runner started (already gone is fine: it ends at once)."""
    pid = job.pid or 0
    alive = pid > 0 and job.pid_ticks is not None and procfs.is_running(pid, job.pid_ticks)
    return JobProcess(
        job.id,
        pid,
        job.pid_ticks if alive else None,
        _events(spec),
        job_folder(directory, job.uid, job.id) / OUTPUT_NAME,
        pidfd=open_pidfd(pid) if alive else None,
    )


def _events(spec: JobSpec) -> EventsTail:
    """The run's events: our file of the job's own from its start; a file the user gave
    (``--events FILE``, which other runs may append to as well) from its end as it is now.
    An adopted run's events in such a file that came before are not read again: its state
    then waits for its next event, and its end comes from its ``stopped`` event."""
    if spec.add_events:
        return EventsTail(spec.events)
    try:
        return EventsTail(spec.events, offset=os.path.getsize(spec.events))
    except OSError:
        return EventsTail(spec.events)  # not there yet


def find_started(job_id: int, directory: LockDirectory) -> tuple[int, int] | None:
    """A run of ``job_id`` that a runner started but did not live to record: one of our
    processes whose environment names this job of this queue. ``(pid, ticks)`` or None."""
    wanted = {"XPULAUNCH_QUEUE_JOB": str(job_id), "XPULAUNCH_QUEUE_DIR": str(directory.root)}
    for info in procfs.iter_processes(os.getuid()):
        if info.gone or info.pid == os.getpid():
            continue
        env = procfs.process_environ(info.pid)
        if all(env.get(k) == v for k, v in wanted.items()):
            return info.pid, info.start_ticks
    return None


def event_time_s(record: dict[str, object]) -> float | None:
    """An event's wall-clock time (its ``time``, ISO 8601 UTC) in seconds since the epoch."""
    text = record.get("time")
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def last_error(output: Path) -> str:
    """The last ``xpulaunch: error: ...`` line of a job's console (without the prefix)."""
    try:
        with open(output, "rb") as handle:
            handle.seek(max(os.fstat(handle.fileno()).st_size - 16384, 0))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return ""
    errors = [line for line in tail.splitlines() if line.startswith(_ERROR_PREFIX)]
    return errors[-1][len(_ERROR_PREFIX) :] if errors else ""
