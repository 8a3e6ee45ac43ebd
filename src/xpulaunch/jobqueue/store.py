"""``queue.sqlite``: the jobs of one lock directory, in SQLite (the standard library's
``sqlite3``) in WAL mode, so that readers (``xpulaunch queue``, ``top``) never wait for a
writer and writers (``submit``, ``cancel``, the runners) take turns for milliseconds.

In a shared lock directory the database is readable and writable by every user, as the lock
files are (SQLite gives its ``-wal`` and ``-shm`` files the database's mode); what a job runs
is never read from it, only from its owner's private job folder (:mod:`.files`). So a user who
edits the database by hand can reorder or relabel jobs, not run a command as someone else.

Every write is one ``BEGIN IMMEDIATE`` transaction; a database another process keeps locked
is waited for ``XPULAUNCH_LOCK_TIMEOUT`` seconds (30 by default) and then named in one line
with who holds it. A file that is not a SQLite database is reported and left as it is.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from xpulaunch.errors import QueueError
from xpulaunch.jobqueue.mounts import filesystem_type, is_network
from xpulaunch.jobqueue.policy import Job, JobState
from xpulaunch.leases.lock_directory import LockDirectory, allocation_lock_timeout_s

DB_NAME = "queue.sqlite"
SCHEMA_VERSION = 1
ACTIVE_STATES = (JobState.QUEUED, JobState.HELD, JobState.STARTING, JobState.RUNNING)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uid INTEGER NOT NULL,
    user TEXT NOT NULL,
    state TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    after TEXT NOT NULL DEFAULT '[]',
    command TEXT NOT NULL,
    gpus TEXT NOT NULL DEFAULT 'auto',
    wanted TEXT NOT NULL DEFAULT '[]',
    shares INTEGER NOT NULL DEFAULT 0,
    submitted_s REAL NOT NULL,
    started_s REAL,
    leased_s REAL,
    ended_s REAL,
    pid INTEGER,
    pid_ticks INTEGER,
    devices TEXT NOT NULL DEFAULT '[]',
    exit_code INTEGER,
    reason TEXT,
    cancel_requested_s REAL,
    grace_s REAL NOT NULL DEFAULT 10,
    lease_job TEXT,
    job_dir TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state);
"""
_JSON_COLUMNS = frozenset({"after", "command", "wanted", "devices"})
_COLUMNS = tuple(f.name for f in dataclasses.fields(Job))  # a Job is its row
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM jobs"
_ID_LIMIT = 1 << 63  # SQLite's INTEGER is 64-bit and signed: no row has a larger id


class Store:
    """An open queue database; every method may raise :class:`QueueError`."""

    def __init__(self, connection: sqlite3.Connection, path: str) -> None:
        self._db = connection
        self.path = path

    @classmethod
    def open(
        cls, directory: LockDirectory, env: Mapping[str, str], *, create: bool
    ) -> Store | None:
        """The queue of ``directory``; None when it has none and ``create`` is false."""
        check_filesystem(directory, env)  # before anything is made there
        if not directory.ensure(create=create):
            return None
        path = directory.join(DB_NAME)
        fd = directory.open_file(DB_NAME, os.O_RDWR, create=create, writable_by_all=True)
        if fd is None:
            return None
        os.close(fd)  # made with the lock directory's modes; SQLite opens it by name
        with _translated(path):
            connection = sqlite3.connect(
                path, timeout=allocation_lock_timeout_s(), isolation_level=None
            )
            store = cls(connection, path)
            store._prepare()
        return store

    def _prepare(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise QueueError(
                f"queue database {self.path} was written by a newer xpulaunch (schema "
                f"{version}, this one knows {SCHEMA_VERSION}); upgrade xpulaunch"
            )
        self._db.execute("PRAGMA journal_mode=WAL")
        with self.write():
            for statement in _SCHEMA.split(";"):
                if statement.strip():  # not executescript: it would commit first
                    self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def write(self) -> Iterator[None]:
        """One write transaction (``BEGIN IMMEDIATE``: writers queue at its start, so a read
        inside it is never stale); rolled back when the block raises."""
        with _translated(self.path):
            self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if self._db.in_transaction:  # SQLite may have rolled back already (a full disk)
                self._db.execute("ROLLBACK")
            raise
        with _translated(self.path):
            self._db.execute("COMMIT")

    def jobs(self, *, ended: bool = False) -> list[Job]:
        """Active jobs (with ``ended``: every job), by id."""
        if ended:
            return self._select("ORDER BY id")
        marks = ", ".join("?" for _ in ACTIVE_STATES)
        return self._select(
            f"WHERE state IN ({marks}) ORDER BY id", [s.value for s in ACTIVE_STATES]
        )

    def with_dependencies(self) -> list[Job]:
        """Active jobs, and the ended jobs they name with ``--after`` (for the ordering)."""
        active = self.jobs()
        known = {j.id for j in active}
        missing = sorted({i for j in active for i in j.after} - known)
        if not missing:
            return active
        marks = ", ".join("?" for _ in missing)
        return sorted(
            [*active, *self._select(f"WHERE id IN ({marks})", missing)], key=lambda j: j.id
        )

    def job(self, job_id: int) -> Job | None:
        if not 0 < job_id < _ID_LIMIT:  # a user's typing: sqlite3 raises OverflowError on it
            return None
        found = self._select("WHERE id = ?", [job_id])
        return found[0] if found else None

    def known_ids(self) -> tuple[int, int] | None:
        """The lowest and highest job id, for messages about an unknown one."""
        with _translated(self.path):
            low, high = self._db.execute("SELECT min(id), max(id) FROM jobs").fetchone()
        return None if low is None else (int(low), int(high))

    def insert(self, **fields: Any) -> int:
        names = list(fields)
        marks = ", ".join("?" for _ in names)
        sql = f"INSERT INTO jobs ({', '.join(names)}) VALUES ({marks})"
        with _translated(self.path):
            cursor = self._db.execute(sql, [_column(n, fields[n]) for n in names])
        return int(cursor.lastrowid or 0)

    def update(self, job_id: int, **fields: Any) -> None:
        sets = ", ".join(f"{name} = ?" for name in fields)
        values = [_column(n, v) for n, v in fields.items()]
        with _translated(self.path):
            self._db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", [*values, job_id])

    def end(self, job_id: int, state: JobState, reason: str, **fields: Any) -> None:
        """Record that a job ended, now."""
        self.update(job_id, state=state, ended_s=time.time(), reason=reason, **fields)

    def data_version(self) -> int:
        """Changes when another connection commits (SQLite's ``PRAGMA data_version``)."""
        with _translated(self.path):
            return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    def _select(self, where: str, params: Sequence[object] = ()) -> list[Job]:
        with _translated(self.path):
            rows = self._db.execute(f"{_SELECT} {where}", list(params)).fetchall()
        return [_job(row) for row in rows]


def check_filesystem(directory: LockDirectory, env: Mapping[str, str]) -> None:
    fs_type = filesystem_type(str(directory.root), env)
    if is_network(fs_type):
        raise QueueError(
            f"lock directory {directory.root} is on {fs_type}, a network filesystem, where "
            "the queue's SQLite database (WAL mode) does not work: use --lock-dir DIR (or "
            "XPULAUNCH_LOCK_DIR) on a local filesystem, such as /tmp or /var/lib"
        )


def _column(name: str, value: object) -> object:
    if name in _JSON_COLUMNS:
        return json.dumps(list(value))  # type: ignore[call-overload]
    if isinstance(value, JobState):
        return value.value
    if isinstance(value, bool):
        return int(value)
    return value


def _job(row: Sequence[Any]) -> Job:
    data = dict(zip(_COLUMNS, row, strict=True))
    for name in _JSON_COLUMNS:
        data[name] = tuple(_json_list(data[name]))
    data["state"] = _state(data["state"])
    data["shares"] = bool(data["shares"])
    data["after"] = tuple(int(i) for i in data["after"] if isinstance(i, int))
    data["command"] = tuple(str(a) for a in data["command"])
    return Job(**data)


def _json_list(text: object) -> list[Any]:
    try:
        value = json.loads(str(text))
    except ValueError:
        return []  # a hand-edited cell: shown as empty rather than failing the whole list
    return value if isinstance(value, list) else []


def _state(text: object) -> JobState:
    try:
        return JobState(str(text))
    except ValueError:
        return JobState.FAILED  # an unknown state (a hand-edited row) never runs


@contextmanager
def _translated(path: str) -> Iterator[None]:
    """SQLite's errors as one :class:`QueueError` line that says what to do."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        raise _operational(path, exc) from exc
    except sqlite3.DatabaseError as exc:
        raise QueueError(
            f"queue database {path} is not a usable SQLite database ({exc}); it is left as it "
            f"is: move it aside (mv {path} {path}.bad) to start an empty queue, or restore it"
        ) from exc


def _operational(path: str, exc: sqlite3.OperationalError) -> QueueError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        holders = lock_holders([path, path + "-shm", path + "-wal"])
        who = f" by {holders}" if holders else ""
        return QueueError(
            f"queue database {path} stayed locked{who} for {allocation_lock_timeout_s():g} s "
            "(XPULAUNCH_LOCK_TIMEOUT); xpulaunch holds it for milliseconds, so something "
            "else holds it: stop that process and try again"
        )
    if "readonly" in text or "unable to open" in text or "disk I/O" in text:
        return QueueError(
            f"queue database {path}: {text}; every user of a shared lock directory must be "
            "able to write it and its -wal and -shm files (chmod 666)"
        )
    return QueueError(f"queue database {path}: {text}")


def lock_holders(paths: Sequence[str]) -> str:
    """``pid 12 (sqlite3 queue.sqlite, user bob)`` for the POSIX locks on ``paths`` (SQLite
    locks with fcntl), from /proc/locks; "" when none is found but ours."""
    wanted = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        wanted[f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"] = path
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return ""
    pids = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] in ("POSIX", "OFDLCK") and fields[5] in wanted:
            pid = int(fields[4]) if fields[4].lstrip("-").isdigit() else -1
            if pid > 0 and pid != os.getpid() and pid not in pids:
                pids.append(pid)
    return ", ".join(_describe_pid(pid) for pid in pids[:3])


def _describe_pid(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = [a.decode(errors="replace") for a in handle.read(4096).split(b"\0") if a]
    except OSError:
        return f"pid {pid}"
    return f"pid {pid} ({' '.join(argv)[:60]})"
