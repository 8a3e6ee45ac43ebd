"""What the queue commands do, minus the printing: submit, cancel, hold, release, and
starting this user's runner when none runs.

A user may change only their own jobs: the commands say so in one line, and the system
enforces it anyway (each user's records are a file only they can write, a job runs only
from its owner's private spec, a run is signalled only by its owner).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from xpulaunch.errors import QueueError, UsageError
from xpulaunch.jobqueue.files import (
    EVENTS_NAME,
    LOGS_NAME,
    RUNNER_LOG,
    JobSpec,
    check_runner_files,
    make_job_folder,
    make_user_folder,
    notify,
    runner_pid,
    write_spec,
)
from xpulaunch.jobqueue.policy import After, Job, JobState
from xpulaunch.jobqueue.store import Store
from xpulaunch.jobqueue.user_store import StoreFull
from xpulaunch.leases.lock_directory import LockDirectory
from xpulaunch.processes import procfs

if TYPE_CHECKING:
    from xpulaunch.leases.manager import LeaseManager

RUNNER_IDLE_EXIT_S = 300.0  # a runner started on demand leaves after this long with no job
ARRAY_LIMIT = 1000  # jobs of one --array
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9._-]{0,63}$")
_WAITER = re.compile(r"^w[0-9]+$")
_ARRAY = re.compile(r"^(?P<low>[0-9]{1,9})(?:-(?P<high>[0-9]{1,9}))?$")


def queue_directory(lock_dir: str | None, env: Mapping[str, str]) -> LockDirectory:
    """The lock directory whose queue the commands use: ``--lock-dir`` (shared), else the
    user's private one, exactly as leases pick it."""
    from xpulaunch.leases.manager import LeaseManager

    # Absolute: the runner and the jobs' runs start elsewhere (the runner in "/").
    return LeaseManager(os.path.abspath(lock_dir) if lock_dir else None, env=env).directory


def lease_manager(directory: LockDirectory) -> LeaseManager:
    """The leases of the queue's lock directory (private or shared, as the queue's)."""
    from xpulaunch.leases.manager import LeaseManager

    manager = LeaseManager(directory.root)
    manager.directory = directory
    return manager


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a container's uid without a passwd entry
        return str(uid)


@dataclass(frozen=True, slots=True)
class Submission:
    """A job to queue: what it runs, and what its plan said when it was submitted."""

    spec: JobSpec
    command: tuple[str, ...]
    gpus: str = "auto"
    wanted: tuple[str, ...] = ()
    shares: bool = False
    grace_s: float = 10.0
    priority: int = 0
    after: tuple[int | str, ...] = ()  # ids or names, with their kind below
    after_any: tuple[int | str, ...] = ()
    after_fail: tuple[int | str, ...] = ()
    hold: bool = False
    name: str | None = None
    array: tuple[int, ...] = ()  # --array: one job per index


def check_name(name: str) -> str:
    """A ``--name``: a letter, then letters, digits, ``.``, ``_``, ``-`` (64 at most); not
    ``w`` and digits (a ``--wait`` launch's id)."""
    if not _NAME.match(name) or _WAITER.match(name):
        raise UsageError(
            f"--name {name!r}: a name starts with a letter and has letters, digits, '.', '_' "
            "or '-' (64 at most), and is not w<digits> (how queue shows a --wait launch)"
        )
    return name


def parse_array(text: str) -> tuple[int, ...]:
    """``--array 4`` (indices 0-3) or ``--array 0-9``: the indices."""
    match = _ARRAY.match(text.strip())
    if match is None:
        raise UsageError(f"--array {text!r}: expected a count (4) or a range (0-9)")
    if match["high"] is None:
        low, high = 0, int(match["low"]) - 1
    else:
        low, high = int(match["low"]), int(match["high"])
    count = high - low + 1
    if count < 1:
        raise UsageError(f"--array {text!r}: no index in it (a count of 1 or more, or LOW-HIGH)")
    if count > ARRAY_LIMIT:
        raise UsageError(f"--array {text!r}: {count} jobs; one array has {ARRAY_LIMIT} at most")
    return tuple(range(low, high + 1))


def submit(directory: LockDirectory, store: Store, job: Submission) -> list[int]:
    """Queue ``job`` (with ``--array``, one job per index); their ids. Each row and its
    private spec are written together, or none of them."""
    uid = os.getuid()
    made: list[Path] = []
    ids: list[int] = []
    try:
        with store.write():
            if job.name is not None:
                taken = [j.id for j in store.jobs() if j.uid == uid and j.name == job.name]
                if taken:
                    raise QueueError(
                        f"--name {job.name}: job {taken[0]} of yours has that name and has not "
                        "ended; pick another, or cancel it"
                    )
            deps = {
                kind: _dependency_ids(store, kind, refs)
                for kind, refs in (
                    (After.OK, job.after),
                    (After.ANY, job.after_any),
                    (After.FAIL, job.after_fail),
                )
            }
            first: int | None = None
            for index in job.array or (None,):
                job_id = store.insert(
                    above=ids[-1] if ids else None,
                    uid=uid,
                    user=user_name(uid),
                    state=JobState.HELD if job.hold else JobState.QUEUED,
                    priority=job.priority,
                    after=deps[After.OK],
                    after_any=deps[After.ANY],
                    after_fail=deps[After.FAIL],
                    command=job.command,
                    gpus=job.gpus,
                    wanted=job.wanted,
                    shares=job.shares,
                    submitted_s=time.time(),
                    grace_s=job.grace_s,
                    name=job.name,
                    array_index=index,
                )
                first = job_id if first is None else first
                folder = make_job_folder(directory, uid, job_id)
                made.append(folder)
                spec = job.spec
                if index is not None:
                    env = {**spec.env, "XPULAUNCH_ARRAY_INDEX": str(index)}
                    spec = replace(spec, env=env)
                if spec.add_events:
                    spec = replace(spec, events=str(folder / EVENTS_NAME))
                if spec.add_log_dir:
                    spec = replace(spec, log_dir=str(folder / LOGS_NAME))
                write_spec(folder, spec)
                array_first = first if index is not None else None
                store.update(job_id, job_dir=str(folder), array_first=array_first)
                ids.append(job_id)
    except BaseException:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    notify(directory)
    return ids


def _dependency_ids(store: Store, kind: After, refs: Sequence[int | str]) -> tuple[int, ...]:
    """The jobs ``--after ID``/``--after-any``/``--after-fail`` name (a name or an array's
    first id: all of its jobs), each once."""
    found: list[int] = []
    for ref in refs:
        ids = resolve(store, ref)
        if not ids:
            raise QueueError(f"--{kind.value} {ref}: no job {ref} in the queue of {store.lock_dir}")
        found += ids
    return tuple(dict.fromkeys(found))


def resolve(store: Store, ref: int | str, *, whole: bool = True) -> list[int]:
    """The jobs ``ref`` names: an id (with ``whole``, an array's first id means every job of
    the array), or a name: this user's active jobs of that name, else the latest that ended
    (names are each user's own). [] for an unknown id; an unknown name is an error."""
    if isinstance(ref, int):
        job = store.job(ref)
        if job is None:
            return []
        if whole and job.array_first == job.id:
            return [j.id for j in _own_array(store, job)]
        return [ref]
    uid = os.getuid()
    named = [j for j in store.jobs() if j.uid == uid and j.name == ref]
    if not named:
        ended = [j for j in store.jobs(ended=True) if j.uid == uid and j.name == ref]
        if ended:
            last = ended[-1]
            group = last.array_first
            named = [j for j in ended if group is not None and j.array_first == group] or [last]
    if not named:
        others = sorted({j.user for j in store.jobs(ended=True) if j.name == ref})
        theirs = f" ({', '.join(others)} has one: use its id)" if others else ""
        raise QueueError(f"no job of yours is named {ref}{theirs}; see xpulaunch queue -a")
    return [j.id for j in named] if whole else [named[0].id]


def _own_array(store: Store, first: Job) -> list[Job]:
    return [j for j in store.jobs(ended=True) if j.uid == first.uid and j.array_first == first.id]


def is_name(text: str) -> bool:
    """Whether ``text`` may be a job's ``--name``."""
    return _NAME.match(text) is not None and not _WAITER.match(text)


def is_waiter(ref: int | str) -> bool:
    """``w4242``: a launch waiting with ``--wait``, not a queue job."""
    return isinstance(ref, str) and _WAITER.match(ref) is not None


def expand(
    store: Store | None, refs: Sequence[int | str], *, whole: bool = True
) -> list[int | str]:
    """``refs`` (ids, names, ``wPID``) with names and arrays as their jobs' ids."""
    found: list[int | str] = []
    for ref in refs:
        if isinstance(ref, str) and _WAITER.match(ref):
            found.append(ref)
        elif store is None:
            if isinstance(ref, str):
                raise QueueError(f"no job of yours is named {ref}: the queue is empty")
            found.append(ref)
        else:
            found += resolve(store, ref, whole=whole) or [ref]  # an unknown id: said later
    return list(dict.fromkeys(found))


def own_job(store: Store, job_id: int, verb: str) -> Job:
    """Job ``job_id``, which must exist and belong to this user (to ``verb`` it)."""
    job = store.job(job_id)
    if job is None:
        known = store.known_ids()
        hint = f"jobs {known[0]}-{known[1]} exist" if known else "the queue is empty"
        where = store.lock_dir
        raise QueueError(
            f"no job {job_id} in the queue of {where} ({hint}; see xpulaunch queue -a)"
        )
    if job.uid != os.getuid():
        raise QueueError(f"job {job_id} belongs to {job.user}: only {job.user} can {verb} it")
    return job


def cancel(directory: LockDirectory, store: Store, job_id: int, *, ended_ok: bool = False) -> str:
    """Cancel one of this user's jobs: a queued one is dropped, a started one's run gets
    SIGTERM (and its workers their ``--grace``; the runner kills the run if it outlives
    that). What was done, in a few words. ``ended_ok``: a job that has just ended (``cancel
    --all`` racing with it) is said so, not an error."""
    job = own_job(store, job_id, "cancel")
    try:
        with store.write():
            job = store.job(job_id) or job
            if job.state.ended and ended_ok:
                return f"job {job_id}: had already ended ({job.state.value})"
            if job.state.ended:
                raise QueueError(f"job {job_id} has already ended ({job.state.value})")
            if job.state.pending:
                reason = f"cancelled by {user_name(os.getuid())} before it started"
                store.end(job_id, JobState.CANCELLED, reason)
            elif job.cancel_requested_s is None:
                store.update(job_id, cancel_requested_s=time.time())
    except StoreFull as exc:
        if job.state.pending:
            raise
        # No room even for the store's reserve: a run filling the disk must still be
        # stoppable. Its end is recorded (as failed: the cancel is not) once there is room.
        stopped = _stop_run(job)
        raise QueueError(
            f"{stopped}; but the cancel was not recorded: {exc.cli_message()}"
        ) from exc
    # The run is signalled only once the request is committed: a run that ends at once must
    # find it, or its runner would record a failure, not a cancel.
    done = f"job {job_id}: cancelled (it had not started)" if job.state.pending else _stop_run(job)
    notify(directory)
    return done


def _stop_run(job: Job) -> str:
    pid = job.pid
    if pid is None or job.pid_ticks is None or not procfs.is_running(pid, job.pid_ticks):
        return f"job {job.id}: cancelled; its run is ending (its runner records it)"
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return f"job {job.id}: cancelled; its run had just ended"
    return f"job {job.id}: stopping (SIGTERM; its workers get {job.grace_s:g} s to exit)"


def cancel_waiter(directory: LockDirectory, pid: int) -> str:
    """Cancel a launch waiting in the lease line with ``--wait`` (SIGTERM, as Ctrl-C would
    stop it); only this user's."""
    waiting = lease_manager(directory).status().waiting
    if not any(w.holder is not None and w.holder.pid == pid for w in waiting):
        raise QueueError(f"w{pid}: no launch with pid {pid} waits for devices in {directory.root}")
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return f"w{pid}: it has just stopped waiting"
    if owner != os.getuid():
        raise QueueError(f"w{pid} belongs to {user_name(owner)}: only they can cancel it")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return f"w{pid}: it has just stopped waiting"
    return f"w{pid}: stopped waiting (SIGTERM)"


def hold(directory: LockDirectory, store: Store, job_id: int, *, held: bool) -> str:
    """Hold a queued job (it keeps its place but does not start) or release a held one."""
    with store.write():
        job = own_job(store, job_id, "hold" if held else "release")
        wanted, target = (
            (JobState.QUEUED, JobState.HELD) if held else (JobState.HELD, JobState.QUEUED)
        )
        if job.state is target:
            return f"job {job_id}: already {target.value}"
        if job.state is not wanted:
            raise QueueError(
                f"job {job_id} is {job.state.value}: only a {wanted.value} job can be "
                f"{'held' if held else 'released'}" + ("; cancel it instead" if held else "")
            )
        store.update(job_id, state=target)
    notify(directory)
    return f"job {job_id}: {target.value}"


def parse_ids(texts: Sequence[str]) -> list[int | str]:
    """Job ids (``17``), names (``--name``) and waiting launches (``w4242``, as ``xpulaunch
    queue`` shows them)."""
    ids: list[int | str] = []
    for text in texts:
        value = text.strip()
        if value.isascii() and value.isdigit() and int(value) > 0:
            ids.append(int(value))
        elif _WAITER.match(value) or _NAME.match(value):
            ids.append(value)
        else:
            raise UsageError(
                f"{text!r} is not a job id: expected a number such as 17, a job's --name, or w4242"
            )
    return ids


def runner_can_start(directory: LockDirectory) -> None:
    """Raise why this user's runner could not start, unless one runs (``submit`` asks before
    it queues a job that would otherwise wait for ever)."""
    uid = os.getuid()
    if runner_pid(directory, uid) is None:
        check_runner_files(directory, uid)


def ensure_runner(directory: LockDirectory, env: Mapping[str, str]) -> int | None:
    """Start this user's runner for ``directory`` unless one runs; its pid if started."""
    uid = os.getuid()
    if runner_pid(directory, uid) is not None:
        return None
    check_runner_files(directory, uid)  # its own start would fail in its log, not here
    folder = make_user_folder(directory, uid)
    argv = [sys.executable, "-m", "xpulaunch", "runner", "--foreground"]
    argv += ["--idle-exit", f"{RUNNER_IDLE_EXIT_S:g}"]
    if directory.shared:
        argv += ["--lock-dir", str(directory.root)]
    # 0600: the folder is open to all (for the records), the runner's log is not.
    fd = os.open(folder / RUNNER_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "ab") as log:
        # Its own session, no terminal, cwd "/": it outlives this command and any shell.
        runner = subprocess.Popen(
            argv,
            env=dict(env),
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    return runner.pid
