"""One user's queue records: ``queue-jobs-<uid>/queue.sqlite``, in SQLite (the standard
library's ``sqlite3``), owned by that user, mode 0644, in a folder only they can write. So
nobody else can change a record or remove the file (the kernel refuses it), while everyone
can read it for the shared view (:mod:`.store`).

Rollback journal, not WAL: a WAL reader must be able to write the ``-shm`` file, which
would make the records writable by all again; readers open the file read-only
(``mode=ro``), and a read takes a POSIX read lock, which a read-only descriptor may take.

``journal_mode=PERSIST`` and a reserve, so that a change that does not add a job (a cancel,
a job's end) still commits on a full disk: a few free pages are kept in the database (a
blob of :data:`RESERVE_PAGES` pages written, then deleted), so a row that grows takes one of
those instead of growing the file; and the journal file is kept, not deleted, after each
commit, as long as its longest transaction (the delete above journals the reserve), so a
small transaction writes into blocks it has already. The reserve is topped up when a submit
or a runner opens the store, with room to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import sqlite3
import stat
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from xpulaunch.errors import QueueError
from xpulaunch.jobqueue.policy import Job, JobState
from xpulaunch.leases.lock_directory import allocation_lock_timeout_s

DB_NAME = "queue.sqlite"
SCHEMA_VERSION = 2
RESERVE_PAGES = 16
_FILE_MODE = 0o644

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
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
    job_dir TEXT NOT NULL DEFAULT '',
    name TEXT,
    after_any TEXT NOT NULL DEFAULT '[]',
    after_fail TEXT NOT NULL DEFAULT '[]',
    array_first INTEGER,
    array_index INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state);
CREATE TABLE IF NOT EXISTS reserve (data BLOB)
"""
# Schema 2's columns, added to a schema-1 store when its owner opens it (a reader of one not
# opened since reads them as their defaults).
_ADDED = {
    "name": "TEXT",
    "after_any": "TEXT NOT NULL DEFAULT '[]'",
    "after_fail": "TEXT NOT NULL DEFAULT '[]'",
    "array_first": "INTEGER",
    "array_index": "INTEGER",
}
_JSON_COLUMNS = frozenset({"after", "command", "wanted", "devices", "after_any", "after_fail"})
_COLUMNS = tuple(f.name for f in dataclasses.fields(Job))  # a Job is its row
_DEFAULTS = {"after_any": "'[]'", "after_fail": "'[]'"}


class StoreFull(QueueError):
    """A write that found no room (a full disk): the runner tries it again, not giving up."""


class UserStore:
    """An open ``queue.sqlite`` of user ``uid``: read-write for its owner, else read-only."""

    def __init__(self, connection: sqlite3.Connection, path: Path, uid: int) -> None:
        self._db = connection
        self.path = path
        self.uid = uid
        self.user = user_name(uid)
        st = os.stat(path)
        self.identity = (st.st_dev, st.st_ino)
        self._select_sql: str | None = None

    @classmethod
    def open_own(cls, folder: Path, *, create: bool) -> UserStore | None:
        """This user's store in ``folder`` (made, with its reserve, when ``create``)."""
        path = folder / DB_NAME
        made = create and _make(path)
        if not made and not path.exists():
            return None
        with translated(path):
            connection = sqlite3.connect(
                path, timeout=allocation_lock_timeout_s(), isolation_level=None
            )
            store = cls(connection, path, os.getuid())
            connection.execute("PRAGMA journal_mode=PERSIST")  # per connection
            store._prepare()
            if create:  # a submit or a runner: not a look (`queue`), which never waits
                store._top_up()
        return store

    @classmethod
    def open_other(cls, folder: Path, uid: int) -> UserStore | None:
        """User ``uid``'s store, read-only; None when it has none. A file that is not theirs
        alone (planted: anyone may create names in a shared directory) is refused."""
        path = folder / DB_NAME
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise QueueError(f"cannot read {path}: {exc.strerror}") from exc
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or stat.S_IMODE(st.st_mode) & 0o022:
            raise QueueError(f"{path} does not belong to uid {uid} alone; it is not read")
        uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
        with translated(path):
            connection = sqlite3.connect(
                uri, uri=True, timeout=allocation_lock_timeout_s(), isolation_level=None
            )
            return cls(connection, path, uid)

    def _prepare(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise QueueError(
                f"queue database {self.path} was written by a newer xpulaunch (schema "
                f"{version}, this one knows {SCHEMA_VERSION}); upgrade xpulaunch"
            )
        with self.write():
            if version == 1:
                for column, kind in _ADDED.items():
                    self._db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")
            else:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():  # not executescript: it would commit first
                        self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        self._select_sql = None

    def _top_up(self) -> None:
        """Free pages back to :data:`RESERVE_PAGES` (a blob written and deleted: its pages
        stay in the file, free); on a full disk, later."""
        free = int(self._db.execute("PRAGMA freelist_count").fetchone()[0])
        if free >= RESERVE_PAGES // 2:
            return
        page_bytes = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        with contextlib.suppress(StoreFull):
            with self.write():
                self._db.execute(
                    "INSERT INTO reserve VALUES (zeroblob(?))", [RESERVE_PAGES * page_bytes]
                )
            # Its own transaction: the pages freed are journaled, so the (kept) journal is
            # as long as the reserve too.
            with self.write():
                self._db.execute("DELETE FROM reserve")

    def replaced(self, *, emptied: bool = True) -> bool:
        """Whether the file by its name is not the one open here any more (moved aside,
        removed, or, with ``emptied``, truncated to an empty queue)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.identity or (emptied and st.st_size == 0)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def write(self) -> Iterator[None]:
        """One write transaction (``BEGIN IMMEDIATE``: writers queue at its start, so a read
        inside it is never stale); rolled back when the block raises."""
        with translated(self.path):
            self._db.execute("BEGIN IMMEDIATE")
        if self.replaced(emptied=False) and self._db.in_transaction:
            # Moved aside since it was opened: its journal's name is the new file's now.
            self._db.execute("ROLLBACK")
            raise QueueError(f"{self.path} was replaced while open; try again")
        try:
            yield
        except BaseException:
            if self._db.in_transaction:  # SQLite may have rolled back already (a full disk)
                self._db.execute("ROLLBACK")
            raise
        with translated(self.path):
            self._db.execute("COMMIT")

    def select(self, where: str, params: Sequence[object] = ()) -> list[Job]:
        """This store's rows as jobs, each of its owner whatever the row says."""
        with translated(self.path):
            rows = self._db.execute(f"{self._select()} {where}", list(params)).fetchall()
        jobs = [_job(row) for row in rows]
        return [
            j
            if (j.uid, j.user) == (self.uid, self.user)
            else dataclasses.replace(j, uid=self.uid, user=self.user)
            for j in jobs
        ]

    def _select(self) -> str:
        """``SELECT`` of every :class:`Job` field; a column that an older schema lacks (a
        store its owner has not opened since) as its default."""
        if self._select_sql is None:
            with translated(self.path):
                rows = self._db.execute("PRAGMA table_info(jobs)").fetchall()
            have = {row[1] for row in rows}
            cells = [
                c if c in have or not have else f"{_DEFAULTS.get(c, 'NULL')} AS {c}"
                for c in _COLUMNS
            ]
            self._select_sql = f"SELECT {', '.join(cells)} FROM jobs"
        return self._select_sql

    def highest_id(self) -> int:
        with translated(self.path):
            return int(self._db.execute("SELECT coalesce(max(id), 0) FROM jobs").fetchone()[0])

    def insert(self, fields: dict[str, Any]) -> None:
        names = list(fields)
        marks = ", ".join("?" for _ in names)
        sql = f"INSERT INTO jobs ({', '.join(names)}) VALUES ({marks})"
        with translated(self.path):
            self._db.execute(sql, [_column(n, fields[n]) for n in names])

    def update(self, job_id: int, fields: dict[str, Any]) -> None:
        sets = ", ".join(f"{name} = ?" for name in fields)
        values = [_column(n, v) for n, v in fields.items()]
        with translated(self.path):
            self._db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", [*values, job_id])


def stamp(path: Path) -> tuple[object, ...]:
    """What changes when a store is committed to or replaced: its inode, size and SQLite's
    file change counter (bytes 24-27 of its header, counted up by every commit)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return (str(path),)
    try:
        st = os.fstat(fd)
        return (str(path), st.st_ino, st.st_size, os.pread(fd, 4, 24))
    finally:
        os.close(fd)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a container's uid without a passwd entry
        return str(uid)


def _make(path: Path) -> bool:
    """Create an empty store; False if it exists."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, _FILE_MODE)
    except FileExistsError:
        return False
    except OSError as exc:
        raise QueueError(f"cannot create {path}: {exc.strerror}") from exc
    os.fchmod(fd, _FILE_MODE)  # through the umask
    os.close(fd)
    # A journal left by the file this one replaces (moved aside): rolled into a new, empty
    # database it would be that file's pages in this one.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{path}-journal")
    return True


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
    for name in ("after", "after_any", "after_fail"):
        data[name] = tuple(int(i) for i in data[name] if isinstance(i, int))
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
def translated(path: str | os.PathLike[str]) -> Iterator[None]:
    """SQLite's errors as one :class:`QueueError` line that says what to do."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        raise _operational(str(path), exc) from exc
    except sqlite3.DatabaseError as exc:
        raise QueueError(
            f"queue database {path} is not a usable SQLite database ({exc}); it is left as it "
            f"is: move it aside (mv {path} {path}.bad) to start an empty queue (a runner that "
            "has it open takes the new one; job ids go on from the highest ever given), or "
            "restore it"
        ) from exc


def _operational(path: str, exc: sqlite3.OperationalError) -> QueueError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        holders = lock_holders([path, path + "-journal"])
        who = f" by {holders}" if holders else ""
        return QueueError(
            f"queue database {path} stayed locked{who} for {allocation_lock_timeout_s():g} s "
            "(XPULAUNCH_LOCK_TIMEOUT); xpulaunch holds it for milliseconds, so something "
            "else holds it: stop that process and try again"
        )
    if "full" in text:
        return StoreFull(f"queue database {path}: {text}")
    if "readonly" in text or "unable to open" in text or "disk I/O" in text:
        return QueueError(
            f"queue database {path}: {text}; only its owner can write it, and it and its "
            "-journal file must be theirs (mode 0644)"
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
