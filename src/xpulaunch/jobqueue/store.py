"""The queue of a lock directory: every user's records (:mod:`.user_store`), read together.

Each user writes only their own ``queue-jobs-<uid>/queue.sqlite``; a :class:`Store` opens
the caller's read-write and everyone else's read-only, and answers for the whole queue: its
jobs by id, a job by its id, the next id. A row is always its store owner's (whatever its
``uid`` column says), and an id that two stores claim is the one of the user that was given
it (``queue-ids/<id>``, :func:`xpulaunch.jobqueue.files.allocate_id`). Another user's store
that cannot be read (corrupt, closed to us, planted) leaves their jobs out, said in
:attr:`Store.problems`; one's own is an error.

Every write is one ``BEGIN IMMEDIATE`` transaction on one's own store; a store another
process keeps locked is waited for ``XPULAUNCH_LOCK_TIMEOUT`` seconds (30 by default) and
then named in one line with who holds it. A file that is not a SQLite database is reported
and left as it is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from xpulaunch.errors import QueueError
from xpulaunch.jobqueue import files
from xpulaunch.jobqueue.mounts import filesystem_type, is_network
from xpulaunch.jobqueue.policy import Job, JobState, depends_on
from xpulaunch.jobqueue.user_store import DB_NAME, UserStore, lock_holders, stamp
from xpulaunch.leases.lock_directory import LockDirectory

__all__ = ["DB_NAME", "Store", "check_filesystem", "lock_holders"]
ACTIVE_STATES = (JobState.QUEUED, JobState.HELD, JobState.STARTING, JobState.RUNNING)
_ID_LIMIT = 1 << 63  # SQLite's INTEGER is 64-bit and signed: no row has a larger id


class Store:
    """The queue of one lock directory; every method may raise :class:`QueueError`."""

    def __init__(self, directory: LockDirectory, own: UserStore | None) -> None:
        self.directory = directory
        self.uid = os.getuid()
        self.own = own
        self.path = str(files.user_folder(directory, self.uid) / DB_NAME)
        self.lock_dir = str(directory.root)
        self.problems: list[str] = []
        self._others: dict[int, UserStore] = {}

    @classmethod
    def open(
        cls, directory: LockDirectory, env: Mapping[str, str], *, create: bool
    ) -> Store | None:
        """The queue of ``directory``; None when it has none and ``create`` is false."""
        check_filesystem(directory, env)  # before anything is made there
        if not directory.ensure(create=create):
            return None
        store = cls(directory, None)
        store.own = store._open_own(create=create)
        if store.own is None and not store._user_folders():
            return None
        return store

    def _open_own(self, *, create: bool) -> UserStore | None:
        folder = files.user_folder(self.directory, self.uid)
        if create:
            files.make_user_folder(self.directory, self.uid)
        elif not os.path.lexists(folder):
            return None
        else:
            files.check_user_folder(folder, self.uid)  # not one planted under our name
        return UserStore.open_own(folder, create=create)

    def reopen_if_replaced(self) -> bool:
        """Take the store by its name again if it was moved aside, removed or emptied (the
        recovery from a corrupt one, done while this process has it open)."""
        if self.own is None or not self.own.replaced():
            return False
        self.own.close()
        self.own = None
        self.own = self._open_own(create=True)
        return True

    def close(self) -> None:
        for store in [self.own, *self._others.values()]:
            if store is not None:
                store.close()
        self.own = None
        self._others.clear()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def write(self) -> Iterator[None]:
        """One write transaction on this user's own store."""
        own = self._writable()
        with own.write():
            yield

    def _writable(self) -> UserStore:
        if self.own is None:
            self.own = self._open_own(create=True)
        assert self.own is not None  # created
        return self.own

    def jobs(self, *, ended: bool = False) -> list[Job]:
        """Active jobs (with ``ended``: every job), by id."""
        if ended:
            return self._select("ORDER BY id")
        marks = ", ".join("?" for _ in ACTIVE_STATES)
        return self._select(f"WHERE state IN ({marks})", [s.value for s in ACTIVE_STATES])

    def with_dependencies(self) -> list[Job]:
        """Active jobs, and the ended jobs they name with ``--after*`` (for the ordering)."""
        active = self.jobs()
        known = {j.id for j in active}
        missing = sorted({i for j in active for i in depends_on(j)} - known)
        if not missing:
            return active
        marks = ", ".join("?" for _ in missing)
        return sorted([*active, *self._select(f"WHERE id IN ({marks})", missing)], key=_id)

    def job(self, job_id: int) -> Job | None:
        if not 0 < job_id < _ID_LIMIT:  # a user's typing: sqlite3 raises OverflowError on it
            return None
        found = self._select("WHERE id = ?", [job_id])
        return found[0] if found else None

    def known_ids(self) -> tuple[int, int] | None:
        """The lowest and highest job id, for messages about an unknown one."""
        ids = [j.id for j in self.jobs(ended=True)]
        return (min(ids), max(ids)) if ids else None

    def insert(self, *, above: int | None = None, **fields: Any) -> int:
        """Add a job to this user's store, under a new id (never one given before); its id.
        Inside :meth:`write`. ``above``: an id this transaction was just given (an array's
        previous job), so the highest known id is not looked for again."""
        own = self._writable()
        if above is not None:
            job_id = files.allocate_id(self.directory, above, scan=False)
            own.insert({"id": job_id, **fields})
            return job_id
        floor = max(
            [own.highest_id(), files.highest_folder_id(self.directory, self.uid)]
            + [other.highest_id() for other in self._other_stores()]
        )
        job_id = files.allocate_id(self.directory, floor)
        own.insert({"id": job_id, **fields})
        return job_id

    def update(self, job_id: int, **fields: Any) -> None:
        """Change a job of this user's (none: a store replaced since, nothing to change)."""
        self._writable().update(job_id, fields)

    def end(
        self,
        job_id: int,
        state: JobState,
        reason: str,
        *,
        ended_s: float | None = None,
        **fields: Any,
    ) -> None:
        """Record that a job ended (``ended_s``, by default now)."""
        when = time.time() if ended_s is None else ended_s
        self.update(job_id, state=state, ended_s=when, reason=reason, **fields)

    def data_version(self) -> tuple[object, ...]:
        """Changes when anyone commits to any store of the queue, or a store comes or goes."""
        return tuple(stamp(folder / DB_NAME) for _, folder in self._user_folders())

    def _select(self, where: str, params: Sequence[object] = ()) -> list[Job]:
        """The rows of every store (this user's first), one per id, ordered by id."""
        found: dict[int, list[Job]] = {}
        stores = [] if self.own is None else [self.own]
        for store in [*stores, *self._other_stores()]:
            for job in store.select(where, params):
                found.setdefault(job.id, []).append(job)
        return sorted((self._one(claims) for claims in found.values()), key=_id)

    def _one(self, claims: list[Job]) -> Job:
        """Of the rows that claim one id, the row of the user that was given it."""
        if len(claims) == 1:
            return claims[0]
        owner = files.id_owner(self.directory, claims[0].id)
        return next((j for j in claims if j.uid == owner), claims[0])

    def _user_folders(self) -> list[tuple[int, Any]]:
        """(uid, folder) of every user folder of the queue."""
        found = []
        for name in self.directory.names(files.JOBS_PREFIX, ""):
            text = name[len(files.JOBS_PREFIX) :]
            if text.isascii() and text.isdigit():
                found.append((int(text), self.directory.path / name))
        return sorted(found)

    def _other_stores(self) -> list[UserStore]:
        """Every other user's store, read-only (reopened when replaced); one that cannot be
        read is left out and said in :attr:`problems`."""
        self.problems = _older_queue(self.directory)
        stores = []
        for uid, folder in self._user_folders():
            if uid == self.uid:
                continue
            store = self._others.get(uid)
            if store is not None and store.replaced():
                self._others.pop(uid).close()
                store = None
            try:
                if store is None:
                    files.check_user_folder(folder, uid)
                    store = UserStore.open_other(folder, uid)
                    if store is not None:
                        store.select("WHERE 0")  # a corrupt or closed one fails here
            except QueueError as exc:
                self.problems.append(exc.cli_message())
                if store is not None:
                    store.close()
                    self._others.pop(uid, None)
                continue
            if store is not None:
                self._others[uid] = store
                stores.append(store)
        return stores


def _id(job: Job) -> int:
    return job.id


def _older_queue(directory: LockDirectory) -> list[str]:
    """The one database of every user that an xpulaunch before per-user stores kept."""
    old = directory.path / DB_NAME
    if not os.path.lexists(old):
        return []
    return [
        f"{old} is the queue of an older xpulaunch (one file all users could write); its "
        "jobs are not read: run them again with xpulaunch submit, then remove it"
    ]


def check_filesystem(directory: LockDirectory, env: Mapping[str, str]) -> None:
    fs_type = filesystem_type(str(directory.root), env)
    if is_network(fs_type):
        raise QueueError(
            f"lock directory {directory.root} is on {fs_type}, a network filesystem, where "
            "the queue's SQLite databases (their locks) do not work: use --lock-dir DIR (or "
            "XPULAUNCH_LOCK_DIR) on a local filesystem, such as /tmp or /var/lib"
        )
