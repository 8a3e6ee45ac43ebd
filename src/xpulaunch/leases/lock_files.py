"""The files of the lock directory: each unit's lock file name, and the record beside a lock
that says who holds it or waits for it (:class:`HolderInfo`, in holder files and tickets).

Unit key <-> lock file name: ``0000:29:00.0/tile1`` <-> ``unit-0000%3A29%3A00.0%2Ftile1.lock``.
Safe (no ``/``, no leading dot), one-to-one and reversible, for any filesystem: keys are
percent-encoded with ``urllib.parse.quote(key, safe="")``, and hashed when too long for a
file name.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath
from urllib.parse import quote, unquote

from xpulaunch.processes.procfs import start_time_s

UNIT_PREFIX = "unit-"
LOCK_SUFFIX, HOLDER_SUFFIX = ".lock", ".holder"
# NAME_MAX is 255 bytes; a longer escaped key is hashed. quote() only writes '%' + two hex
# digits, so '%s...' can never be an escaped key: no collision.
_MAX_ESCAPED_KEY = 200
_HASHED = "%sha256-"
# Tickets and holder files hold a small JSON record; anything larger was not written by us.
_MAX_RECORD_BYTES = 64 * 1024


def lock_file_name(key: str) -> str:
    """``0000:29:00.0/tile1`` -> ``unit-0000%3A29%3A00.0%2Ftile1.lock``: no ``/``, no dot."""
    return _escape(key) + LOCK_SUFFIX


def holder_file_name(key: str) -> str:
    return _escape(key) + HOLDER_SUFFIX


def key_of_lock_file(name: str) -> str | None:
    """The unit key of a lock file name; None for a hashed (very long) key."""
    stem = name[len(UNIT_PREFIX) : -len(LOCK_SUFFIX)]
    return None if stem.startswith(_HASHED) else unquote(stem)


def _escape(key: str) -> str:
    # Percent-encode all but [A-Za-z0-9_.~-]: one-to-one, and portable to any filesystem.
    escaped = quote(key, safe="")
    if not escaped or len(escaped) > _MAX_ESCAPED_KEY:
        import hashlib  # loads OpenSSL: imported only for the rare key too long to escape

        escaped = _HASHED + hashlib.sha256(key.encode()).hexdigest()
    return UNIT_PREFIX + escaped


@dataclass(frozen=True, slots=True)
class HolderInfo:
    """Who holds a lease or waits for one, as written to its holder file or ticket."""

    pid: int
    argv: tuple[str, ...]
    user: str
    since_s: float  # wall clock, seconds since the epoch
    job_id: str
    hostname: str
    pid_started_s: float | None = None  # the pid's start time: tells a reused pid apart

    @classmethod
    def of_this_process(cls, job_id: str, command: Sequence[str] | None = None) -> HolderInfo:
        return cls(
            pid=os.getpid(),
            argv=tuple(sys.argv if command is None else command),
            user=user_name(os.getuid()),
            since_s=time.time(),
            job_id=job_id,
            hostname=host_name(),
            pid_started_s=start_time_s(os.getpid()),
        )

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "argv": list(self.argv)}

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> HolderInfo | None:
        """The record, or None when it is missing or was not written by us."""
        if not data:
            return None
        pid, argv, since = data.get("pid"), data.get("argv"), data.get("since_s")
        user, job_id, host = data.get("user"), data.get("job_id"), data.get("hostname")
        started = data.get("pid_started_s")
        if not (
            isinstance(pid, int)
            and isinstance(argv, list)
            and all(isinstance(a, str) for a in argv)
            and isinstance(since, (int, float))
            and isinstance(user, str)
            and isinstance(job_id, str)
            and isinstance(host, str)
        ):
            return None
        started_s = float(started) if isinstance(started, (int, float)) else None
        return cls(pid, tuple(argv), user, float(since), job_id, host, started_s)

    def command(self, width: int | None = 60) -> str:
        """Short command line: ``xpulaunch --gpus 1 train.py``; cut to ``width`` (None: whole)."""
        if not self.argv:
            return "?"
        text = shlex.join([PurePosixPath(self.argv[0]).name, *self.argv[1:]])
        return text if width is None or len(text) <= width else text[: width - 3] + "..."

    def since(self) -> str:
        """Local start time: ``10:02`` today, else ``2025-11-21 10:02``."""
        then = time.localtime(self.since_s)
        today = time.localtime()[:3] == then[:3]
        return time.strftime("%H:%M" if today else "%Y-%m-%d %H:%M", then)

    def describe(self) -> str:
        """``pid 123 (python train.py, user bob, since 10:02)``, for messages and notes; a
        holder that is gone says so."""
        where = "" if self.hostname == host_name() else f" on {self.hostname}"
        details = f"{self.command()}, user {self.user}, since {self.since()}"
        if self.alive() is False:
            # The lease is held by processes it started; naming the pid alone would send the
            # user to kill a process that is gone, or one that got its pid since.
            gone = f", which has exited ({details}; processes it started still hold it)"
            return f"pid {self.pid}{where}{gone}"
        return f"pid {self.pid}{where} ({details})"

    def alive(self) -> bool | None:
        """Whether the recorded pid still runs (None: unknown, on another host).

        For display only: a lease lives as long as any process holding its lock, and the
        recording xpulaunch process may be gone while its workers still hold it.
        """
        if self.hostname != host_name():
            return None
        started_s = start_time_s(self.pid)  # None: gone, or a zombie (it holds no files)
        if started_s is None or self.pid_started_s is None:
            return started_s is not None
        return abs(started_s - self.pid_started_s) < 1.0  # another start time: a reused pid


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # containers often run as a uid without a passwd entry
        return str(uid)


def host_name() -> str:
    return os.uname().nodename  # what socket.gethostname() returns on Linux


def write_record(fd: int, record: Mapping[str, object]) -> None:
    """Replace a small file's content with a JSON record (readers hold the allocation lock)."""
    data = json.dumps(dict(record), sort_keys=True).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def read_record(fd: int) -> dict[str, object] | None:
    try:
        data = json.loads(os.pread(fd, _MAX_RECORD_BYTES, 0))
    except (OSError, ValueError):
        # Empty between the lock and the write of a dying launch, or foreign content: the
        # record is unknown, which readers show as such.
        return None
    return data if isinstance(data, dict) else None
