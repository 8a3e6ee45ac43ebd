"""``xpulaunch logs ID``: the RUN of ``logs`` may be a job id of the queue (a directory of
that name wins); its workers' logs are read as any run's, and a job whose run never started
a worker shows its run's own console (``output.log``) instead."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from xpulaunch.errors import QueueError
from xpulaunch.jobqueue import actions
from xpulaunch.jobqueue.files import OUTPUT_NAME, job_folder, read_spec
from xpulaunch.jobqueue.policy import Job, JobState
from xpulaunch.jobqueue.store import Store

WAIT_INTERVAL_S = 0.5


def is_job_id(text: str) -> bool:
    return text.isascii() and text.isdigit() and not os.path.isdir(text)


def job_log_dir(text: str, lock_dir: str | None, *, follow: bool) -> Path | None:
    """The log directory of job ``text``, once it has one; None when its run wrote no worker
    log (then its console was printed). With ``follow`` a job not started yet is waited for."""
    env = dict(os.environ)
    directory = actions.queue_directory(lock_dir, env)
    store = Store.open(directory, env, create=False)
    if store is None:
        raise QueueError(f"no job {text}: {directory.root} has no queue")
    with store:
        job = _readable(store, int(text))
        folder = job_folder(directory, job.uid, job.id)
        while True:
            log_dir = _log_dir(folder, job.uid)
            if log_dir is not None and _has_attempts(log_dir):
                return log_dir
            if job.state is JobState.CANCELLED and job.started_s is None:
                raise QueueError(_never_started(job))
            if job.state.ended or (job.state is JobState.RUNNING and not follow):
                _print_console(folder)
                return None
            if not follow:
                raise QueueError(
                    f"job {job.id} has not started yet ({job.state.value}); "
                    f"'xpulaunch logs -f {job.id}' waits for it"
                )
            time.sleep(WAIT_INTERVAL_S)
            job = store.job(job.id) or job


def _never_started(job: Job) -> str:
    """``job 4 was cancelled before it started`` (and why, when it was its ``--after``)."""
    why = (job.reason or "").removeprefix("never started: ")
    detail = f": {why}" if why.startswith("--after") else ""
    return f"job {job.id} was cancelled before it started{detail}"


def _readable(store: Store, job_id: int) -> Job:
    job = store.job(job_id)
    if job is None:
        actions.own_job(store, job_id, "read")  # raises the unknown-id message
        raise QueueError(f"no job {job_id}")  # pragma: no cover
    if job.uid != os.getuid() and os.getuid() != 0:
        raise QueueError(f"job {job_id} belongs to {job.user}: its logs are private to them")
    return job


def _log_dir(folder: Path, uid: int) -> Path | None:
    try:
        spec = read_spec(folder, uid)
    except QueueError:
        return None
    return Path(spec.log_dir) if spec.log_dir else None


def _has_attempts(folder: Path) -> bool:
    try:
        return any(p.name.startswith("attempt_") or p.is_dir() for p in folder.iterdir())
    except OSError:
        return False


def _print_console(folder: Path) -> None:
    try:
        data = (folder / OUTPUT_NAME).read_bytes()
    except OSError:
        return
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
