"""The lock directory of device leases: where it is, who may use it, and opening and
locking its files (:mod:`xpulaunch.leases.manager` builds leases on it).

A private directory (the default, ``$XDG_RUNTIME_DIR/xpulaunch`` or ``/tmp/xpulaunch-UID``) is
the user's own, mode 0700; a shared one (``--lock-dir``, for containers that share GPUs) is
like /tmp: anyone creates, nobody deletes others' files, lock and holder files are readable and
writable by all. A filesystem whose flock does not work is a :class:`LeaseError`, never a
silent fallback.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import pwd
import signal
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from xpulaunch.errors import LeaseError, UsageError
from xpulaunch.leases.lock_files import read_record, write_record
from xpulaunch.processes.procfs import is_stopped

LOCK_DIR_VAR = "XPULAUNCH_LOCK_DIR"
ALLOCATION_LOCK = "allocate.lock"
ALLOCATION_LOCK_TIMEOUT_S = 30.0
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


@dataclass(frozen=True, slots=True)
class LockDirectory:
    """A lock directory: private to one user (0700, verified) or shared by several users."""

    root: str | os.PathLike[str]
    shared: bool
    owner_uid: int | None = None  # who must own a private directory

    @property
    def path(self) -> Path:
        return Path(self.root)

    @classmethod
    def resolve(
        cls,
        lock_dir: str | os.PathLike[str] | None,
        env: Mapping[str, str],
        *,
        uid: int | None = None,
    ) -> LockDirectory:
        """The lock directory every entry point uses (the CLI, ``status``, the Python API):
        ``lock_dir`` when given, else ``XPULAUNCH_LOCK_DIR``, both shared; else the private
        :meth:`default`. One function, so that an API job and a CLI job with the same
        environment always see each other's leases."""
        chosen = lock_dir if lock_dir else env.get(LOCK_DIR_VAR, "")
        if chosen:
            return cls(chosen, shared=True)
        return cls.default(env, uid=uid)

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
            # Whose file it is helps only where there is one: creating it failed otherwise.
            what = (
                f"create {path}"
                if not os.path.lexists(path)
                else f"open {path} (made by {owner_of(path)})"
            )
            raise LeaseError(
                f"cannot {what}: {exc.strerror}; every user of a lock directory must be able "
                f"to write to it (a shared one: chmod 1777), or {_HINT}"
            ) from exc
        if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LeaseError(
                f"{path} (made by {owner_of(path)}) is not a regular file; remove it or {_HINT}"
            )
        return fd

    def must_open(self, name: str, access: int) -> int:
        fd = self.open_file(name, access, create=True, writable_by_all=True)
        if fd is None:  # pragma: no cover - open_file returns None only without create
            raise LeaseError(f"cannot create {self.join(name)}")
        return fd

    def try_lock(self, fd: int, *, shared: bool = False) -> bool:
        """Take an exclusive (or ``shared``) flock without blocking; False when someone else
        holds it."""
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _HELD_ERRNOS:
                return False
            raise self._lock_failure(exc) from exc
        return True

    def is_held(self, name: str) -> bool:
        """Whether another process holds the lock on ``name``, a name that a scan of the
        directory found; a missing file is not held.

        Nor is a file that is none of ours (a symlink, a FIFO, a directory, a file we may not
        open): anyone may create names in a shared directory, and nobody may remove another's,
        so failing on one would stop every launch and ``status`` for good. If it has the name
        of a device's lock, taking that lease opens it and fails naming its owner.
        """
        try:
            fd = self.open_file(name, os.O_RDONLY, create=False, writable_by_all=True)
        except LeaseError:
            return False
        if fd is None:
            return False
        try:
            return not self.try_lock(fd)
        finally:
            os.close(fd)  # drops the probe's own lock on a free file

    def write(self, name: str, record: Mapping[str, object]) -> None:
        """Replace the JSON record in ``name`` (a holder file)."""
        fd = self.must_open(name, os.O_WRONLY)
        try:
            write_record(fd, record)
        except OSError as exc:
            raise LeaseError(f"cannot write {self.join(name)}: {exc.strerror}") from exc
        finally:
            os.close(fd)

    def read(self, name: str) -> dict[str, object] | None:
        """The JSON record in ``name``; None when it is missing or unreadable (an unreadable
        holder file only costs the holder's details)."""
        try:
            fd = self.open_file(name, os.O_RDONLY, create=False, writable_by_all=True)
        except LeaseError:
            return None
        if fd is None:
            return None
        try:
            return read_record(fd)
        finally:
            os.close(fd)

    @contextmanager
    def allocation_lock(self) -> Iterator[None]:
        """Hold the directory-wide allocation lock. Our holders keep it for milliseconds, but
        anyone who can open the file can hold it for ever (``flock allocate.lock sleep inf``
        in a shared directory), so it is waited for with a deadline and a message naming the
        holder, never silently for good."""
        timeout_s = allocation_lock_timeout_s()
        with _stop_deferred():
            fd = self.must_open(ALLOCATION_LOCK, os.O_RDONLY)
            try:
                self._lock_with_deadline(fd, timeout_s)
                yield
            finally:
                os.close(fd)  # our only descriptor of it: closing releases the lock

    def _lock_with_deadline(self, fd: int, timeout_s: float) -> None:
        deadline_s = time.monotonic() + timeout_s
        delay_s = 0.001
        while not self.try_lock(fd):
            if time.monotonic() >= deadline_s:
                raise self._held_too_long(fd, timeout_s)
            time.sleep(min(delay_s, max(deadline_s - time.monotonic(), 0)))
            delay_s = min(delay_s * 2, 0.1)

    def _held_too_long(self, fd: int, timeout_s: float) -> LeaseError:
        pid = lock_holder_pid(fd)
        holder = "another process" if pid is None else _describe_pid(pid)
        where = f"{self.join(ALLOCATION_LOCK)} has been locked for {timeout_s:g} s by {holder}"
        if pid is not None and is_stopped(pid):
            # SIGSTOP cannot be deferred as Ctrl-Z is (see _stop_deferred), and a stopped
            # holder never lets go: say so, and how to let it go on.
            return LeaseError(
                f"{where}, which is stopped (Ctrl-Z or SIGSTOP) while it holds the lock: "
                f"continue it ('fg', or 'kill -CONT {pid}') or end it"
            )
        return LeaseError(
            f"{where}; xpulaunch holds it for milliseconds, so something else holds "
            f"it: stop that process, or {_HINT}"
        )

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


@contextmanager
def _stop_deferred() -> Iterator[None]:
    """Hold back Ctrl-Z (SIGTSTP) while this launch holds ``allocate.lock``.

    A launch stopped while it holds the lock would stop every other launch of the lock
    directory with it (``--wait`` takes the lock several times a second). So a SIGTSTP that
    comes meanwhile is kept, and acted on (the process stops) right after the lock is let go.
    Only on the main thread (where Python runs signal handlers) and only while nobody else
    handles SIGTSTP; SIGSTOP cannot be held back (:meth:`LockDirectory._held_too_long` names
    a holder stopped by it).
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTSTP) is not signal.SIG_DFL
    ):
        yield
        return
    pending: list[int] = []
    signal.signal(signal.SIGTSTP, lambda signum, _frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        if pending:
            os.kill(os.getpid(), signal.SIGTSTP)  # stop now, as the user asked


def allocation_lock_timeout_s() -> float:
    """``XPULAUNCH_LOCK_TIMEOUT`` seconds, else :data:`ALLOCATION_LOCK_TIMEOUT_S`."""
    text = os.environ.get("XPULAUNCH_LOCK_TIMEOUT", "")
    try:
        value = float(text) if text else ALLOCATION_LOCK_TIMEOUT_S
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise UsageError(f"XPULAUNCH_LOCK_TIMEOUT={text[:40]!r}: expected a number of seconds >= 0")
    return value


def lock_holder_pid(fd: int) -> int | None:
    """The pid holding the flock on ``fd``'s file, from ``/proc/locks``; None if unknown."""
    st = os.fstat(fd)
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted:
            pid = int(fields[4])
            return pid if pid > 0 else None  # 0 or -1: a process of another pid namespace
    return None


def _describe_pid(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read(4096).split(b"\0")
        owner = _user_name(os.stat(f"/proc/{pid}").st_uid)
    except OSError:
        return f"pid {pid}"
    command = " ".join(a.decode(errors="replace") for a in argv if a)[:80]
    return f"pid {pid} ({command}, user {owner})"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def owner_of(path: str) -> str:
    """``user bob`` for the owner of ``path`` (for messages about planted files)."""
    try:
        return "user " + _user_name(os.lstat(path).st_uid).removeprefix("uid ")
    except OSError:
        return "an unknown user"


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
