"""``xpulaunch logs ID``: the RUN of ``logs`` may be a job id or ``--name`` of the queue (a
directory of that name wins); its workers' logs are read as any run's, and a job whose run
never started a worker shows its run's own console (``output.log``) instead. ``-f`` ends
with the job's exit status (:func:`final_status`)."""

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
END_RECORD_WAIT_S = 30.0  # a run gone, its end not yet recorded by its runner: this long
NO_STATUS = 1  # the exit status of a job that ended with none (cancelled before it started)


def is_job_id(text: str) -> bool:
    """A job id, or a name (``--name``) that is not a path here."""
    if text.isascii() and text.isdigit():
        return not os.path.isdir(text)
    return not os.path.lexists(text) and actions.is_name(text)


def exit_status(job: Job) -> int:
    """What ``wait`` and ``logs -f`` exit with for an ended job: its exit status, or
    :data:`NO_STATUS` when it has none (cancelled before it started, could not start)."""
    if job.exit_code is not None:
        return job.exit_code if 0 <= job.exit_code < 256 else NO_STATUS
    return 0 if job.state is JobState.DONE else NO_STATUS


def final_status(text: str, lock_dir: str | None) -> int:
    """Job ``text``'s exit status once its end is recorded (its run may be gone a moment
    before its runner writes it down: waited for a bounded time)."""
    env = dict(os.environ)
    directory = actions.queue_directory(lock_dir, env)
    store = Store.open(directory, env, create=False)
    if store is None:
        raise QueueError(f"no job {text}: {directory.root} has no queue")
    with store:
        job = _readable(store, _job_id(store, text))
        deadline_s = time.monotonic() + END_RECORD_WAIT_S
        while not job.state.ended and time.monotonic() < deadline_s:
            time.sleep(WAIT_INTERVAL_S / 5)
            job = store.job(job.id) or job
        if not job.state.ended:
            raise QueueError(f"job {job.id}: its run ended, but its end is not recorded yet")
        return exit_status(job)


def _job_id(store: Store, text: str) -> int:
    if text.isdigit():
        found = actions.resolve(store, int(text), whole=False)
        return found[0] if found else int(text)  # an unknown id: _readable says so
    try:
        return actions.resolve(store, text, whole=False)[0]
    except QueueError as exc:  # logs' RUN may have meant a directory
        raise QueueError(f"{exc.cli_message()}; nor is {text} a directory here") from exc


def job_log_dir(text: str, lock_dir: str | None, *, follow: bool) -> Path | None:
    """The log directory of job ``text``, once it has one; None when its run wrote no worker
    log (then its console was printed). With ``follow`` a job not started yet is waited for."""
    env = dict(os.environ)
    directory = actions.queue_directory(lock_dir, env)
    store = Store.open(directory, env, create=False)
    if store is None:
        nor = "" if text.isdigit() else f"; nor is {text} a directory here"
        raise QueueError(f"no job {text}: {directory.root} has no queue{nor}")
    with store:
        job = _readable(store, _job_id(store, text))
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
