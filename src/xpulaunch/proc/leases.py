"""Device reservations across processes: one ``flock`` per unit key in a lock directory.

How a lease works (landscape pitfall 15):

* Each unit key (:attr:`xpulaunch.model.Unit.key`: a card's PCI address or UUID, with
  ``/tileN`` for a tile) has a lock file ``unit-<escaped key>.lock``; a job holds an exclusive
  ``flock`` on it. flock locks belong to the *open file description*, so every process that
  inherited the descriptor holds the lease too: the supervisor passes :attr:`Lease.fds` to its
  workers and its guardian (``pass_fds``), and the lease ends when the last of them exits --
  also when the xpulaunch process itself was SIGKILLed (gpu_lock_exec's inheritable-fd trick).
  Our descriptors are non-inheritable (PEP 446); ``pass_fds`` makes them inheritable only in
  the children that should hold them.
* :meth:`Lease.release` only closes our descriptors, never ``LOCK_UN``: unlocking would drop the
  lock of the whole open file description, also for workers that are still alive. The one
  place that unlocks is the supervisor, once it has seen every process of the job gone (by
  session and marker, as the guardian would): then waiting for the guardian to exit is not
  needed for the devices to be free when ``run`` returns (issue 4; see
  :meth:`xpulaunch.proc.engine.Engine.release_leases`).
* Lock files are never deleted: unlinking a lock file that others have open puts later lockers
  on another inode and breaks mutual exclusion (py-filelock #31).
* Who holds a unit is in a side file ``unit-<escaped key>.holder``, written after the lock is
  taken. Readers find holders by *trying* the lock; a side file whose lock is free is stale and
  ignored, so a reused pid cannot fake a holder: the kernel lock is the truth.
* Reading the leases, planning and locking happen under the directory-wide allocation lock
  ``allocate.lock``, so two launches racing for ``--gpus 1`` never pick the same unit. Every
  probe of a lock (``status`` too) happens under it, so a probe never fails an allocation.

Plain ``fcntl.flock``, not ``filelock.FileLock``: py-filelock keeps its descriptor private and
non-inheritable and releases with ``LOCK_UN`` -- the three things a lease held by the workload
must not do -- and on a filesystem without flock it falls back to ``SoftFileLock`` (4.x) or
retries forever (3.x takes any other flock error for contention). We raise a clear LeaseError.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from contextlib import ExitStack, contextmanager

from xpulaunch._dataclass import dataclass, field
from xpulaunch.errors import DeviceBusyError, LeaseError, SelectionError
from xpulaunch.proc.lease_names import (
    HOLDER_SUFFIX,
    LOCK_SUFFIX,
    UNIT_PREFIX,
    holder_file_name,
    key_of_lock_file,
    lock_file_name,
)
from xpulaunch.proc.queue import (
    HolderInfo,
    WaiterRecord,
    WaitQueue,
    WaitStatus,
    read_record,
    wait_in_line,
    write_record,
)

# Start-up time (issue 4): every launch allocates, so this module imports neither typing nor
# pathlib (~4 ms with the urllib.parse and ipaddress it pulls in) nor uuid (~4 ms). Paths are
# strings inside; the public ``Path`` attributes are built when asked for.
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from pathlib import Path

    from xpulaunch.model import Plan

    PlanFn = Callable[[Mapping[str, str]], Plan]

ALLOCATION_LOCK = "allocate.lock"
_HELD_ERRNOS = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES})
# flock(2) on filesystems without working locks (some NFS mounts, FUSE, odd container mounts).
_NO_LOCK_ERRNOS = frozenset(
    {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS}
)
_HINT = "use --lock-dir DIR (or XPULAUNCH_LOCK_DIR)"
_PRIVATE_DIR_MODE, _PRIVATE_FILE_MODE = 0o700, 0o600
# A shared directory is like /tmp (anyone creates, nobody deletes others' files); its lock and
# holder files are locked and rewritten by every user, tickets only by their owner.
_SHARED_DIR_MODE, _SHARED_FILE_MODE, _SHARED_TICKET_MODE = 0o1777, 0o666, 0o644


def _path(root: str | os.PathLike[str]) -> Path:
    from pathlib import Path  # only for the callers that ask for a Path (status, tests)

    return Path(root)


@dataclass(frozen=True, slots=True)
class LockDirectory:
    """A lock directory: private to one user (0700, verified) or shared by several users."""

    root: str | os.PathLike[str]  # the directory (a string on the launch path)
    shared: bool
    owner_uid: int | None = None  # who must own a private directory

    @property
    def path(self) -> Path:
        return _path(self.root)

    @classmethod
    def default(
        cls,
        env: Mapping[str, str],
        *,
        uid: int | None = None,
        tmp_root: str | os.PathLike[str] = "/tmp",
    ) -> LockDirectory:
        """``$XDG_RUNTIME_DIR/xpulaunch``, else ``/tmp/xpulaunch-<uid>``; private either way."""
        uid = os.getuid() if uid is None else uid
        runtime = env.get("XDG_RUNTIME_DIR", "")
        # The XDG spec says to ignore a relative XDG_RUNTIME_DIR; a missing one (su, cron,
        # containers) falls back to /tmp, as the supervisor's job records do.
        if os.path.isabs(runtime) and os.path.isdir(runtime):
            return cls(os.path.join(runtime, "xpulaunch"), shared=False, owner_uid=uid)
        return cls(os.path.join(tmp_root, f"xpulaunch-{uid}"), shared=False, owner_uid=uid)

    def join(self, name: str) -> str:
        return os.path.join(self.root, name)

    def ensure(self, *, create: bool) -> bool:
        """Check (and with ``create``, make) the directory; False when it does not exist."""
        if create:
            _make_dir(self.root, _SHARED_DIR_MODE if self.shared else _PRIVATE_DIR_MODE)
        try:
            # lstat for a private directory: a symlink planted in /tmp is refused, not followed.
            st = os.stat(self.root) if self.shared else os.lstat(self.root)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise LeaseError(f"lock directory {self.root}: {exc.strerror}; {_HINT}") from exc
        if not stat.S_ISDIR(st.st_mode):
            raise LeaseError(f"lock directory {self.root} is not a directory; remove it or {_HINT}")
        if not self.shared:
            self._check_private(st)
        return True

    def _check_private(self, st: os.stat_result) -> None:
        if st.st_uid != self.owner_uid:
            raise LeaseError(
                f"lock directory {self.root} belongs to uid {st.st_uid}, not to you (uid "
                f"{self.owner_uid}), so its owner could fake or break your reservations; "
                f"remove it or {_HINT}"
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o022:
            raise LeaseError(
                f"lock directory {self.root} has mode {mode:04o}, so other users may have "
                f"planted files in it; a private lock directory must be 0700: check it and run "
                f"'chmod 700 {self.root}', or {_HINT}"
            )
        if mode & 0o077:
            # Only readable by others (a parent made by ``mkdir -p`` under umask 022): nothing
            # can have been planted, so closing it is safe.
            os.chmod(self.root, _PRIVATE_DIR_MODE)

    def open_file(
        self, name: str, access: int, *, create: bool, writable_by_all: bool
    ) -> int | None:
        """Open a regular file here (no symlinks, no blocking); None if absent and not created."""
        path = self.join(name)
        if not self.shared:
            mode = _PRIVATE_FILE_MODE
        else:
            mode = _SHARED_FILE_MODE if writable_by_all else _SHARED_TICKET_MODE
        try:
            fd = _open(path, access | os.O_NOFOLLOW | os.O_NONBLOCK, mode, create=create)
        except OSError as exc:
            raise LeaseError(
                f"cannot open {path}: {exc.strerror}; every user of a lock directory must be "
                f"able to write to it (a shared one: chmod 1777), or {_HINT}"
            ) from exc
        if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LeaseError(f"{path} is not a regular file; remove it or {_HINT}")
        return fd

    def must_open(self, name: str, access: int) -> int:
        fd = self.open_file(name, access, create=True, writable_by_all=True)
        if fd is None:  # pragma: no cover - open_file returns None only without create
            raise LeaseError(f"cannot create {self.join(name)}")
        return fd

    def try_lock(self, fd: int) -> bool:
        """Take an exclusive flock without blocking; False when someone else holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _HELD_ERRNOS:
                return False
            raise self._lock_failure(exc) from exc
        return True

    @contextmanager
    def allocation_lock(self) -> Iterator[None]:
        """Hold the directory-wide allocation lock (blocking: holders keep it milliseconds)."""
        fd = self.must_open(ALLOCATION_LOCK, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                raise self._lock_failure(exc) from exc
            yield
        finally:
            os.close(fd)  # our only descriptor of it: closing releases the lock

    def _lock_failure(self, exc: OSError) -> LeaseError:
        if exc.errno in _NO_LOCK_ERRNOS:
            return LeaseError(
                f"lock directory {self.root} does not support file locks (flock: "
                f"{exc.strerror}); {_HINT} on a local filesystem, such as /tmp"
            )
        return LeaseError(f"cannot lock a file in {self.root}: {exc.strerror}")

    def names(self, prefix: str, suffix: str) -> list[str]:
        try:
            entries = os.listdir(self.root)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise LeaseError(f"cannot list lock directory {self.root}: {exc.strerror}") from exc
        return [n for n in entries if n.startswith(prefix) and n.endswith(suffix)]


def _make_dir(path: str | os.PathLike[str], mode: int) -> None:
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        return
    except OSError as exc:
        raise LeaseError(f"cannot create lock directory {path}: {exc.strerror}; {_HINT}") from exc
    os.chmod(path, mode)  # mkdir's mode went through the umask


def _open(path: str, flags: int, mode: int, *, create: bool) -> int | None:
    if create:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            pass
        else:
            os.fchmod(fd, mode)  # the umask would strip the bits a shared directory needs
            return fd
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        if create:
            raise
        return None


@dataclass(eq=False)
class Lease:
    """Locks held for one job; ``release()`` closes our descriptors (idempotent).

    Workers that inherited :attr:`fds` keep the lease after ``release()``: it ends when the
    last process holding them exits, or when the supervisor that ran them has seen every
    process of the job gone and unlocked it. ``shared`` leases (``--shared``) and CPU plans
    hold none.
    """

    keys: tuple[str, ...]
    fds: tuple[int, ...]
    job_id: str
    root: str | os.PathLike[str]  # the lock directory
    shared: bool = False
    released: bool = field(default=False, init=False)

    @property
    def lock_dir(self) -> Path:
        return _path(self.root)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError as exc:
                if exc.errno != errno.EBADF:  # already closed is what we wanted
                    raise

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A leased unit, as ``xpulaunch status`` shows it."""

    key: str
    holder: HolderInfo | None  # None: held, but its holder file is missing or unreadable
    holder_alive: bool | None  # the recording pid; its workers may hold the lease without it


@dataclass(frozen=True, slots=True)
class StatusReport:
    """Leases and waiting launches of one lock directory (``xpulaunch status``)."""

    lock_dir: Path
    shared_dir: bool
    exists: bool = True
    leases: tuple[LeaseRecord, ...] = ()
    waiting: tuple[WaiterRecord, ...] = ()


class LeaseManager:
    """Atomic allocation of leases in one lock directory, with a FIFO queue for ``--wait``.

    ``lock_dir=None`` is the private per-user directory (:meth:`LockDirectory.default`); an
    explicit directory is shared by several users (files readable and writable by all).
    """

    def __init__(
        self,
        lock_dir: str | os.PathLike[str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        poll_interval_s: float = 0.2,
        uid: int | None = None,
    ) -> None:
        if lock_dir is None:
            env = os.environ if env is None else env
            self.directory = LockDirectory.default(env, uid=uid)
        else:
            self.directory = LockDirectory(lock_dir, shared=True)
        self._clock = clock
        self._sleep = sleep
        self._poll_interval_s = poll_interval_s

    @property
    def lock_dir(self) -> Path:
        return self.directory.path

    def unavailable(self) -> dict[str, str]:
        """Unit key -> who holds it, now (for a dry run; reserves nothing)."""
        if not self.directory.ensure(create=False):
            return {}
        with self.directory.allocation_lock():
            return _describe(self._held())

    def allocate(
        self,
        plan_fn: PlanFn,
        *,
        shared: bool = False,
        wait: bool = False,
        wait_timeout_s: float | None = None,
        on_wait: Callable[[WaitStatus], None] | None = None,
        command: Sequence[str] | None = None,
    ) -> tuple[Plan, Lease]:
        """Plan with the leased units excluded and lock the plan's units, atomically.

        ``plan_fn(unavailable)`` must be pure and quick (it runs under the allocation lock);
        it raises SelectionError when too few units are free, DeviceBusyError for a leased
        explicit unit. ``shared``: explicitly named units are used even when leased, auto/N
        still avoid leased units, and nothing is locked. ``wait``: queue, first come first
        served, while the request fails because of leases. ``command``: the holder's command
        line for ``status`` (default: this process's argv).
        """
        self.directory.ensure(create=True)
        # 12 random hex digits, as uuid4().hex[:12] gave (its first 6 bytes are all random).
        holder = HolderInfo.of_this_process(os.urandom(6).hex(), command)
        if not wait:
            with self.directory.allocation_lock():
                return self._allocate_now(plan_fn, holder, shared=shared)
        plan_fn({})  # a request that fails with nothing leased can never be met: fail now

        def attempt() -> tuple[Plan, Lease] | str:
            try:
                return self._allocate_now(plan_fn, holder, shared=shared)
            except (SelectionError, DeviceBusyError) as exc:
                return exc.message

        return wait_in_line(
            self.directory,
            holder.to_dict(),
            attempt,
            clock=self._clock,
            sleep=self._sleep,
            poll_interval_s=self._poll_interval_s,
            timeout_s=wait_timeout_s,
            on_wait=on_wait,
        )

    def status(self) -> StatusReport:
        """Current leases and waiting launches."""
        directory = self.directory
        if not directory.ensure(create=False):
            return StatusReport(directory.path, directory.shared, exists=False)
        with directory.allocation_lock():
            held = self._held()
            waiting = tuple(WaitQueue(directory).live())
        leases = tuple(
            LeaseRecord(key, info, info.alive() if info else None)
            for key, info in sorted(held.items())
        )
        return StatusReport(directory.path, directory.shared, True, leases, waiting)

    def _allocate_now(
        self, plan_fn: PlanFn, holder: HolderInfo, *, shared: bool
    ) -> tuple[Plan, Lease]:
        unavailable = _describe(self._held())
        if shared:
            try:
                plan = plan_fn(unavailable)
            except DeviceBusyError:
                plan = plan_fn({})  # a leased unit named explicitly: sharing it is the point
            return plan, Lease((), (), holder.job_id, self.directory.root, shared=True)
        plan = plan_fn(unavailable)
        return plan, self._lock(plan.lease_keys, holder)

    def _lock(self, keys: Sequence[str], holder: HolderInfo) -> Lease:
        with ExitStack() as undo:
            fds: list[int] = []
            for key in keys:
                fd = self.directory.must_open(lock_file_name(key), os.O_RDONLY)
                undo.callback(os.close, fd)
                fds.append(fd)
                if not self.directory.try_lock(fd):
                    who = HolderInfo.from_dict(self._read(holder_file_name(key)))
                    raise DeviceBusyError(
                        f"{key} was leased by {who.describe() if who else 'another process'} "
                        "while this launch was planning; try again, or wait with --wait"
                    )
            for key in keys:
                self._write(holder_file_name(key), {"key": key, **holder.to_dict()})
            undo.pop_all()
        return Lease(tuple(keys), tuple(fds), holder.job_id, self.directory.root)

    def _held(self) -> dict[str, HolderInfo | None]:
        """Unit key -> holder (None: unknown) of every leased unit. Under the allocation lock."""
        held: dict[str, HolderInfo | None] = {}
        for name in self.directory.names(UNIT_PREFIX, LOCK_SUFFIX):
            fd = self.directory.open_file(name, os.O_RDONLY, create=False, writable_by_all=True)
            if fd is None:
                continue
            try:
                free = self.directory.try_lock(fd)
            finally:
                os.close(fd)  # drops the probe's own lock on a free unit
            if free:
                continue  # a stale holder file next to it is ignored
            record = self._read(name[: -len(LOCK_SUFFIX)] + HOLDER_SUFFIX)
            key = key_of_lock_file(name) or str((record or {}).get("key", name))
            held[key] = HolderInfo.from_dict(record)
        return held

    def _write(self, name: str, record: Mapping[str, object]) -> None:
        fd = self.directory.must_open(name, os.O_WRONLY)
        try:
            write_record(fd, record)
        except OSError as exc:
            raise LeaseError(f"cannot write {self.directory.join(name)}: {exc.strerror}") from exc
        finally:
            os.close(fd)

    def _read(self, name: str) -> dict[str, object] | None:
        try:
            fd = self.directory.open_file(name, os.O_RDONLY, create=False, writable_by_all=True)
        except LeaseError:
            return None  # an unreadable holder file only costs the holder's details
        if fd is None:
            return None
        try:
            return read_record(fd)
        finally:
            os.close(fd)


def _describe(held: Mapping[str, HolderInfo | None]) -> dict[str, str]:
    return {
        key: info.describe() if info else "another job (its holder record is missing)"
        for key, info in held.items()
    }
