"""The queue's files in a lock directory:

* ``queue-jobs-<uid>/`` -- each user's folder (0755, checked to be theirs and writable by
  them alone), with ``queue.sqlite``, that user's records (0644: :mod:`.user_store`), and one
  private folder (0700) per job: ``spec.json`` (what the job runs: its arguments,
  environment, working directory; 0600), ``output.log`` (its ``xpulaunch run``'s console),
  ``events.jsonl`` and ``logs/`` (its workers' log files). Only the owner can change their
  records or their jobs; everyone can read the records, for the shared view.
* ``queue-ids/`` -- like /tmp (1777 in a shared directory): an empty file per job id ever
  given out, created with ``O_EXCL`` by the submitter, so two users never get one id and no
  id is given twice (not after a store is moved aside either). Its owner is the id's owner.
  A runner holds its ``flock`` (a read-only descriptor suffices) while it picks the next job.
* ``queue-runner-<uid>.lock`` -- held (``flock``) by that user's runner while it runs: the
  kernel drops it when the runner dies, however it dies, so a live lock is a live runner.
* ``queue-wake-<uid>`` -- a FIFO the runner waits on; whoever changes the queue writes a byte
  to every runner's, so a submit starts at once without the runners polling fast.
* ``queue-jobs-<uid>/draining`` -- there while that user's runner drains (``xpulaunch runner
  --drain``): it starts no job, and leaves once its running jobs ended; ``--resume`` removes
  it. A file, not a message to the runner: the runner reads it each turn (the FIFO wakes
  it), a runner started later drains too, and ``queue`` can say it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from xpulaunch.errors import LeaseError, QueueError
from xpulaunch.leases.lock_directory import LockDirectory, owner_of

JOBS_PREFIX = "queue-jobs-"
RUNNER_PREFIX, RUNNER_SUFFIX = "queue-runner-", ".lock"
WAKE_PREFIX = "queue-wake-"
SPEC_NAME, OUTPUT_NAME, EVENTS_NAME, LOGS_NAME = "spec.json", "output.log", "events.jsonl", "logs"
RUNNER_LOG = "runner.log"
DRAIN_NAME, NOTIFY_LOG, NOTIFIED_NAME = "draining", "notify.log", "notified"
IDS_NAME = "queue-ids"
_PRIVATE = 0o700
_READABLE = 0o755  # a user's folder: the records in it are read by everyone, written by one
_ID_DIGITS = 15  # a name longer than this (anyone may create one) is not an id we gave out
_ORDER_LOCK_WAIT_S = 2.0  # anyone may hold it (a read-only descriptor suffices): not for ever
_SPEC_MAX_BYTES = 8 * 1024 * 1024  # an environment and a command line, with room to spare
# A runner that starts while someone probes its lock (for microseconds) tries again.
_LOCK_TRIES_S = 1.0


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a job runs: ``xpulaunch run`` with ``args``, as the user who submitted it."""

    args: tuple[str, ...]  # run's options and PROGRAM with its arguments, as given to submit
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "/"
    python: str = ""  # the interpreter of the xpulaunch that accepted the job
    profile: str | None = None
    events: str = ""  # where its run writes its events (ours, or the user's --events FILE)
    log_dir: str = ""  # its workers' logs (ours, or the user's --log-dir)
    add_events: bool = True  # whether the run gets --events from us
    add_log_dir: bool = True
    notify: str = ""  # --notify: run as ``sh -c NOTIFY`` when the job ends


def user_folder(directory: LockDirectory, uid: int) -> Path:
    return directory.path / f"{JOBS_PREFIX}{uid}"


def job_folder(directory: LockDirectory, uid: int, job_id: int) -> Path:
    return user_folder(directory, uid) / str(job_id)


def make_private(folder: Path) -> bool:
    """Create ``folder`` (0700); False when it exists already."""
    try:
        os.mkdir(folder, _PRIVATE)
    except FileExistsError:
        return False
    except OSError as exc:
        raise QueueError(f"cannot create {folder}: {exc.strerror}") from exc
    return True


def make_user_folder(directory: LockDirectory, uid: int) -> Path:
    """Create (or open up, from 0700) the user's folder, 0755; refuse one that is not theirs."""
    folder = user_folder(directory, uid)
    try:
        os.mkdir(folder, _READABLE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise QueueError(f"cannot create {folder}: {exc.strerror}") from exc
    check_user_folder(folder, uid)
    if stat.S_IMODE(os.lstat(folder).st_mode) != _READABLE:
        os.chmod(folder, _READABLE)  # mkdir's mode went through the umask; or an older 0700
    return folder


def make_job_folder(directory: LockDirectory, uid: int, job_id: int) -> Path:
    """Create the job's folder (and the user's); refuse a folder that is not theirs."""
    folder = make_user_folder(directory, uid)
    job = folder / str(job_id)
    if not make_private(job):
        # An id used before (ids are never given twice, but queue-ids/ may have been
        # removed along with every store): that job's console, events and logs would pass
        # for this one's (`logs` would show them, the runner would read
        # its lease and its end). Kept, under another name, for whoever restores it.
        check_private(job, uid)
        aside = folder / f"{job_id}.old-{time.time_ns()}"
        try:
            os.rename(job, aside)
        except OSError as exc:
            raise QueueError(f"cannot move {job} aside to {aside.name}: {exc.strerror}") from exc
        make_private(job)
    return job


def check_user_folder(folder: Path, uid: int) -> None:
    try:
        st = os.lstat(folder)
    except OSError as exc:
        raise QueueError(f"{folder}: {exc.strerror}") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or stat.S_IMODE(st.st_mode) & 0o022:
        raise QueueError(
            f"{folder} is not a private folder of uid {uid} (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}): someone else made it; remove it and submit again"
        )


def check_private(path: Path, uid: int) -> None:
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise QueueError(f"{path}: {exc.strerror}") from exc
    if st.st_uid != uid or stat.S_IMODE(st.st_mode) & 0o022 or stat.S_ISLNK(st.st_mode):
        raise QueueError(f"{path} does not belong to uid {uid} alone; it is not used")


def write_spec(folder: Path, spec: JobSpec) -> None:
    path = folder / SPEC_NAME
    data = json.dumps(asdict(spec)).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        raise QueueError(f"cannot write {path}: {exc.strerror}") from exc


def read_spec(folder: Path, uid: int) -> JobSpec:
    """The job's spec, only from a folder and file that belong to ``uid`` alone."""
    check_user_folder(folder.parent, uid)
    path = folder / SPEC_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise QueueError(f"cannot read {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if st.st_uid != uid or stat.S_IMODE(st.st_mode) & 0o022:
            raise QueueError(f"{path} does not belong to uid {uid} alone; it is not run")
        raw = handle.read(_SPEC_MAX_BYTES)
    try:
        data = json.loads(raw)
        return JobSpec(**{**data, "args": tuple(data["args"])})
    except (ValueError, TypeError, KeyError) as exc:
        raise QueueError(f"{path} is not a job spec written by xpulaunch ({exc})") from exc


class RunnerLock:
    """``queue-runner-<uid>.lock``: this user's runner holds it while it runs."""

    def __init__(self, directory: LockDirectory, uid: int) -> None:
        self._directory = directory
        self.name = f"{RUNNER_PREFIX}{uid}{RUNNER_SUFFIX}"
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take it (trying for a moment, as a prober may hold it); False: a runner runs."""
        fd = self._directory.open_file(self.name, os.O_RDWR, create=True, writable_by_all=False)
        if fd is None:  # pragma: no cover - created above
            return False
        if os.fstat(fd).st_uid != os.getuid():
            os.close(fd)
            raise QueueError(
                f"{self._directory.join(self.name)} was made by another user, who could keep "
                "your runner from starting; remove it"
            )
        deadline_s = time.monotonic() + _LOCK_TRIES_S
        while not self._directory.try_lock(fd):
            if time.monotonic() > deadline_s:
                os.close(fd)
                return False
            time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def runner_pid(directory: LockDirectory, uid: int) -> int | None:
    """The pid of ``uid``'s live runner; None when none runs."""
    name = f"{RUNNER_PREFIX}{uid}{RUNNER_SUFFIX}"
    try:
        fd = directory.open_file(name, os.O_RDONLY, create=False, writable_by_all=False)
    except LeaseError:
        return None  # a folder, FIFO or link by that name (anyone may make one): no runner's
    if fd is None:
        return None
    try:
        if os.fstat(fd).st_uid != uid or directory.try_lock(fd):
            return None  # not its own, or free: its runner is gone (closing drops our probe)
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    finally:
        os.close(fd)
    return int(text) if text.isascii() and text.isdigit() else 0


def check_runner_files(directory: LockDirectory, uid: int) -> None:
    """Raise the error ``uid``'s runner would stop with at its start (in a log nobody reads,
    its jobs waiting for ever): its lock or its wake-up FIFO is there already, but not a
    regular file or a FIFO of that user's (anyone may make one in a shared directory)."""
    names = {
        f"{RUNNER_PREFIX}{uid}{RUNNER_SUFFIX}": stat.S_ISREG,
        f"{WAKE_PREFIX}{uid}": stat.S_ISFIFO,
    }
    for name, right_kind in names.items():
        path = directory.join(name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # the runner makes it
        except OSError as exc:
            raise QueueError(f"cannot use {path}: {exc.strerror}") from exc
        if st.st_uid != uid or not right_kind(st.st_mode):
            raise QueueError(
                f"{path} (made by {owner_of(path)}) is not your runner's: no runner of yours "
                "can start while it is there; have its owner (or root) remove it, or use "
                "--lock-dir DIR (or XPULAUNCH_LOCK_DIR)"
            )


def live_runners(directory: LockDirectory) -> dict[int, int]:
    """uid -> pid of every live runner of the directory."""
    found = {}
    for name in directory.names(RUNNER_PREFIX, RUNNER_SUFFIX):
        uid_text = name[len(RUNNER_PREFIX) : -len(RUNNER_SUFFIX)]
        if uid_text.isascii() and uid_text.isdigit():
            pid = runner_pid(directory, int(uid_text))
            if pid is not None:
                found[int(uid_text)] = pid
    return found


class WakePipe:
    """The runner's FIFO. Opened read-write, so that it never reads end-of-file (which would
    wake a select() at once, forever) when no writer has it open."""

    def __init__(self, directory: LockDirectory, uid: int) -> None:
        path = directory.join(f"{WAKE_PREFIX}{uid}")
        mode = 0o622 if directory.shared else 0o600
        with contextlib.suppress(FileExistsError):
            os.mkfifo(path, mode)
            os.chmod(path, mode)  # mkfifo's mode went through the umask
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError as exc:
            raise QueueError(f"cannot open {path}: {exc.strerror}; remove it") from exc
        st = os.fstat(self.fd)
        if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.getuid():
            os.close(self.fd)
            raise QueueError(f"{path} is not this user's FIFO; remove it")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.fd, 4096):
                pass

    def close(self) -> None:
        os.close(self.fd)


def notify(directory: LockDirectory) -> None:
    """Wake every runner of the directory (a byte in each FIFO). One that cannot be woken is
    left to its next look at the queue, which comes every few seconds anyway: a full or
    readerless FIFO (its runner is awake or gone), or whatever else bears a FIFO's name (a
    folder, another user's file, a link: anyone may make one in a shared directory). Never an
    error: the change it tells of is committed already, and a caller that failed now would
    have its user do it twice."""
    for name in directory.names(WAKE_PREFIX, ""):
        try:
            fd = os.open(directory.join(name), os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                with contextlib.suppress(BlockingIOError, BrokenPipeError):  # full; no reader
                    os.write(fd, b"\0")
        finally:
            os.close(fd)


def drain_requested(directory: LockDirectory, uid: int) -> bool:
    """Whether user ``uid``'s runner drains (their folder holds a ``draining`` file)."""
    try:
        st = os.lstat(user_folder(directory, uid) / DRAIN_NAME)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == uid


def set_drain(directory: LockDirectory, uid: int, *, on: bool) -> bool:
    """Ask this user's runner to drain (``on``) or to start jobs again; whether it changed."""
    path = make_user_folder(directory, uid) / DRAIN_NAME
    if on:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
        except FileExistsError:
            return False
        except OSError as exc:
            raise QueueError(f"cannot create {path}: {exc.strerror}") from exc
        return True
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise QueueError(f"cannot remove {path}: {exc.strerror}") from exc
    return True


def job_env(spec: JobSpec, job_id: int, directory: LockDirectory) -> Mapping[str, str]:
    """The job's run's environment: the submitter's, and which queue job it is."""
    return {
        **spec.env,
        "XPULAUNCH_QUEUE_JOB": str(job_id),
        "XPULAUNCH_QUEUE_DIR": str(directory.root),
    }


def _ids_folder(directory: LockDirectory) -> Path:
    """``queue-ids/``, made like /tmp in a shared directory (anyone creates, nobody removes
    another's), private in a private one."""
    folder = directory.path / IDS_NAME
    mode = 0o1777 if directory.shared else _PRIVATE
    try:
        os.mkdir(folder, mode)
    except FileExistsError:
        pass
    except OSError as exc:
        raise QueueError(f"cannot create {folder}: {exc.strerror}") from exc
    else:
        os.chmod(folder, mode)  # through the umask
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
        raise QueueError(f"{folder} is not a folder (made by {owner_of(str(folder))}); remove it")
    return folder


def given_ids(directory: LockDirectory) -> list[int]:
    """Every job id given out in ``directory`` (the names in ``queue-ids/``)."""
    try:
        names = os.listdir(directory.path / IDS_NAME)
    except OSError:
        return []
    return [int(n) for n in names if n.isascii() and n.isdigit() and len(n) <= _ID_DIGITS]


def allocate_id(directory: LockDirectory, floor: int, *, scan: bool = True) -> int:
    """A job id never given out before in ``directory``, above ``floor`` (the highest id any
    store or job folder knows: an id folder removed does not make ids start again). Without
    ``scan``, ``floor`` is an id just given (an array's previous job): the names are not
    listed again, the next free one above it is taken."""
    folder = _ids_folder(directory)
    job_id = (max([floor, *given_ids(directory)]) if scan else floor) + 1
    while True:
        try:
            fd = os.open(folder / str(job_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        except FileExistsError:
            job_id += 1  # another submit's, just now (or anyone's name in a shared folder)
            continue
        except OSError as exc:
            raise QueueError(f"cannot create {folder / str(job_id)}: {exc.strerror}") from exc
        os.close(fd)
        return job_id


def id_owner(directory: LockDirectory, job_id: int) -> int | None:
    """The uid that was given ``job_id`` (None: unknown)."""
    try:
        return os.lstat(directory.path / IDS_NAME / str(job_id)).st_uid
    except OSError:
        return None


def highest_folder_id(directory: LockDirectory, uid: int) -> int:
    """The highest job id that has a folder of ``uid``'s (0: none)."""
    try:
        names = os.listdir(user_folder(directory, uid))
    except OSError:
        return 0
    ids = [n.split(".", 1)[0] for n in names]
    return max(
        (int(i) for i in ids if i.isascii() and i.isdigit() and len(i) <= _ID_DIGITS), default=0
    )


@contextlib.contextmanager
def order_lock(directory: LockDirectory) -> Iterator[None]:
    """Held by a runner while it picks and marks the next job of the whole queue, so that two
    users' runners do not both start one (a ``flock`` of ``queue-ids/``). Anyone can hold it,
    so it is waited for a moment only; then the pick goes ahead without it (at worst two
    jobs wait in the lease line at once, which orders them itself)."""
    try:
        fd = os.open(_ids_folder(directory), os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        deadline_s = time.monotonic() + _ORDER_LOCK_WAIT_S
        while not directory.try_lock(fd) and time.monotonic() < deadline_s:
            time.sleep(0.01)
        yield
    finally:
        os.close(fd)
