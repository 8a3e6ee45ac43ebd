"""The first-come-first-served queue of launches waiting for devices (``--wait``).

Each waiting launch owns one *ticket* file in the lock directory, named
``wait-<sequence>-<pid>.ticket`` and held with an exclusive ``flock`` for as long as the launch
waits. A ticket whose lock can be taken belongs to a dead waiter (the kernel dropped its lock
when the process died, whatever killed it), so dead waiters drop out on their own and a reused
pid cannot keep a ticket alive. Sequence numbers are handed out under the directory-wide
allocation lock, so they follow arrival order; every read or change of the queue happens under
that lock too, so probes never race with each other or with a ticket being created.

Why strict FIFO (only the oldest live ticket may allocate) and no backfilling: a waiter cannot
see what the waiters ahead of it need (each request lives in its own process as an opaque
planning function), so it cannot tell whether taking a free device now would delay them.
Letting any waiter that fits go first starves a ``--gpus 4`` waiter behind a stream of
``--gpus 1`` jobs on a busy box (the Slurm-without-backfill trade-off). Strict FIFO may leave a
device idle while the head of the queue waits for more, but every waiter runs, in arrival
order, as jobs finish. Launches without ``--wait`` do not queue: they try once.

A ticket holds the same record as a lease's holder file
(:class:`~xpulaunch.leases.lock_files.HolderInfo`). Imported only by a launch that waits (and
by ``status``): one that tries once never loads it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import TypeVar

from xpulaunch.errors import LeaseError, WaitTimeoutError
from xpulaunch.leases.lock_directory import LockDirectory
from xpulaunch.leases.lock_files import (
    HolderInfo,
    host_name,
    read_record,
    user_name,
    write_record,
)
from xpulaunch.processes.procfs import is_stopped

T = TypeVar("T")

TICKET_PREFIX = "wait-"
TICKET_SUFFIX = ".ticket"


@dataclass(frozen=True, slots=True)
class WaitStatus:
    """What a waiting launch waits for, and for how long (for a live status line)."""

    waited_s: float
    position: int  # 1 = next in line
    reason: str
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class WaiterRecord:
    """A live waiting launch, as ``xpulaunch status`` shows it."""

    position: int  # 1 = next in line
    holder: HolderInfo | None  # None: its ticket has no readable record
    waiting_for: str | None
    stopped: bool = False  # stopped (Ctrl-Z, SIGSTOP): it does not hold the line meanwhile
    owner: str = ""  # the ticket file's owner (``user bob``)
    ignored: str | None = None  # why this locked ticket holds nobody back (see _not_a_waiter)
    wants: tuple[str, ...] = ()  # the unit keys its plan would take, were nothing leased


@dataclass(frozen=True, slots=True)
class Blocked:
    """What an ``attempt`` of :func:`wait_in_line` returns when it cannot succeed yet: why,
    and the unit keys it would take were nothing leased (a model router frees those when only
    its idle models hold them)."""

    reason: str
    wants: tuple[str, ...] = ()


class Ticket:
    """This launch's place in the queue; ``close()`` leaves the queue (idempotent)."""

    def __init__(self, directory: LockDirectory, name: str, fd: int, record: Mapping[str, object]):
        self.name = name
        self._directory = directory
        self._fd: int | None = fd
        self._record = dict(record)

    def update(self, waiting_for: str, wants: Sequence[str] = ()) -> None:
        """Say what this launch waits for (shown by ``xpulaunch status``), and which units it
        would take. Under the lock."""
        record = {**self._record, "waiting_for": waiting_for, "wants": list(wants)}
        if self._fd is not None and record != self._record:
            self._record = record
            write_record(self._fd, record)

    def close(self) -> None:
        if self._fd is None:
            return
        # Unlink while still holding the lock: nobody ever sees our ticket unlocked and alive.
        with suppress(FileNotFoundError):
            os.unlink(self._directory.join(self.name))
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class WaitQueue:
    """The tickets of one lock directory. Every method expects the allocation lock held."""

    def __init__(self, directory: LockDirectory):
        self._directory = directory

    def join(self, record: Mapping[str, object]) -> Ticket:
        """Take the next place in line, holding a fresh ticket for as long as we wait."""
        names = self._directory.names(TICKET_PREFIX, TICKET_SUFFIX)
        sequence = max((_order(n)[0] for n in names), default=0) + 1
        name = f"{TICKET_PREFIX}{sequence:012d}-{os.getpid()}{TICKET_SUFFIX}"
        fd = self._directory.open_file(name, os.O_RDWR, create=True, writable_by_all=False)
        if fd is None or not self._directory.try_lock(fd):
            # Cannot happen to a name handed out under the allocation lock; never wait on a
            # ticket that is not ours.
            if fd is not None:
                os.close(fd)
            raise LeaseError(f"could not create and lock the wait ticket {name}")
        ticket = Ticket(self._directory, name, fd, record)
        try:
            write_record(fd, record)
        except OSError as exc:  # a full disk: say which file, and leave no ticket behind
            ticket.close()
            path = self._directory.join(name)
            raise LeaseError(f"cannot write the wait ticket {path}: {exc.strerror}") from exc
        return ticket

    def live(self, *, ahead_of: Ticket | None = None) -> list[WaiterRecord]:
        """Live waiters in arrival order (only those before ``ahead_of`` when given).

        Dead waiters' tickets are removed on the way; one another user left in a sticky shared
        directory cannot be removed by us and is skipped like any dead ticket.
        """
        found: list[WaiterRecord] = []
        for name in sorted(self._directory.names(TICKET_PREFIX, TICKET_SUFFIX), key=_order):
            if ahead_of is not None and _order(name) >= _order(ahead_of.name):
                break
            probed = self._probe(name)
            if probed is not None:
                record, owner_uid = probed
                reason = record.get("waiting_for")
                waiting_for = reason if isinstance(reason, str) else None
                holder = HolderInfo.from_dict(record)
                ignored = _not_a_waiter(holder, owner_uid)
                stopped = False  # Ctrl-Z, SIGSTOP: seen only in this host's live waiters
                if ignored is None and holder is not None and holder.alive():
                    stopped = is_stopped(holder.pid)
                owner = "user " + user_name(owner_uid)
                wants = record.get("wants")
                keys = (
                    tuple(k for k in wants if isinstance(k, str)) if isinstance(wants, list) else ()
                )
                found.append(
                    WaiterRecord(len(found) + 1, holder, waiting_for, stopped, owner, ignored, keys)
                )
        return found

    def _probe(self, name: str) -> tuple[Mapping[str, object], int] | None:
        """The record of a locked ticket ({} when unreadable) and its file's owner uid; None
        for a dead one, and for a file that is no ticket (see LockDirectory.is_held)."""
        try:
            fd = self._directory.open_file(name, os.O_RDONLY, create=False, writable_by_all=False)
        except LeaseError:
            return None
        if fd is None:
            return None
        try:
            if self._directory.try_lock(fd):
                with suppress(FileNotFoundError, PermissionError):
                    os.unlink(self._directory.join(name))
                return None
            return read_record(fd) or {}, os.fstat(fd).st_uid
        finally:
            os.close(fd)


def _not_a_waiter(holder: HolderInfo | None, owner_uid: int) -> str | None:
    """Why a locked ticket is not a live xpulaunch waiter's (None: it is one).

    Anyone may create and lock a file in a shared (1777) lock directory, so a lock alone
    does not make a waiter: a ticket counts only when it holds the record xpulaunch writes
    (under the allocation lock, before anyone can look) and, for a waiter of this host, its
    recorded process is alive (the same start time) and runs as the ticket's owner. Anything
    else (an empty or foreign file, a record naming a dead, reused or another user's pid)
    is skipped by the queue and shown by ``status`` with its owner. A record from another
    host (a container with a hostname of its own) cannot be checked beyond its lock, which
    its process holds, so it counts.
    """
    if holder is None:
        return "not a waiting xpulaunch (no record of one in it)"
    if holder.hostname != host_name():
        return None
    if not holder.alive():
        return f"its record names pid {holder.pid}, which is not running"
    try:
        runs_as = os.stat(f"/proc/{holder.pid}").st_uid
    except OSError:
        return f"its record names pid {holder.pid}, which is not running"
    if runs_as != owner_uid:
        return f"its record names pid {holder.pid}, which runs as another user"
    return None


def wait_in_line(
    directory: LockDirectory,
    record: Mapping[str, object],
    attempt: Callable[[], T | str | Blocked],
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    poll_interval_s: float,
    timeout_s: float | None = None,
    on_wait: Callable[[WaitStatus], None] | None = None,
) -> T:
    """Queue, and call ``attempt()`` under the allocation lock whenever we are first in line.

    ``attempt`` returns its result, or why it cannot succeed yet (a string, or
    :class:`Blocked` with the units it wants). Wake-ups
    are polls every ``poll_interval_s``: no daemon, nothing to notify.
    """
    start_s = clock()
    # Compare against a deadline, not a remaining time: a sleep of the float remainder then
    # always reaches it (with a coarse or fake clock, remainders can round to no progress).
    deadline_s = None if timeout_s is None else start_s + timeout_s
    with directory.allocation_lock():
        ticket = WaitQueue(directory).join(record)
    with ticket:
        while True:
            outcome, position = _take_turn(directory, ticket, attempt)
            if not isinstance(outcome, str):
                return outcome
            now_s = clock()
            waited_s = now_s - start_s
            if deadline_s is not None and now_s >= deadline_s:
                limit = f"--wait-timeout {timeout_s:g}"
                raise WaitTimeoutError(
                    f"gave up after waiting {waited_s:.0f} s ({limit}): {outcome}"
                )
            if on_wait is not None:
                on_wait(WaitStatus(waited_s, position, outcome, timeout_s))
            sleep(
                poll_interval_s if deadline_s is None else min(poll_interval_s, deadline_s - now_s)
            )


def _take_turn(
    directory: LockDirectory, ticket: Ticket, attempt: Callable[[], T | str | Blocked]
) -> tuple[T | str, int]:
    """One look at the queue and, when first in line, one attempt; with our position."""
    with directory.allocation_lock():
        # A stopped waiter (Ctrl-Z) keeps its place but does not hold the line: it takes its
        # turn again once continued, and nobody waits behind a terminal left suspended.
        waiters = WaitQueue(directory).live(ahead_of=ticket)
        first = [w for w in waiters if not w.stopped and w.ignored is None]
        if first:
            return f"{len(first)} earlier launch(es) go first ({_who(first)})", len(first) + 1
        outcome = attempt()
        if isinstance(outcome, Blocked):
            ticket.update(outcome.reason, outcome.wants)
            return outcome.reason, 1
        if isinstance(outcome, str):
            ticket.update(outcome)
        else:
            ticket.close()  # still under the lock: the next waiter sees us gone at once
        return outcome, 1


def _who(waiters: Sequence[WaiterRecord]) -> str:
    """``pid 12 of user bob, pid 40 of user ann``: who goes first (their tickets' owners)."""
    named = [
        f"pid {w.holder.pid} of {w.owner}" if w.holder is not None else w.owner for w in waiters[:3]
    ]
    more = f" and {len(waiters) - 3} more" if len(waiters) > 3 else ""
    return ", ".join(named) + more


def _order(name: str) -> tuple[int, str]:
    head = name[len(TICKET_PREFIX) :].split("-", 1)[0]
    return (int(head) if head.isdigit() else 0, name)


def wait_line(status: WaitStatus) -> str:
    """``waiting 12 s for devices (next in line): --gpus 1: only 0 free device(s) ...``"""
    place = "next in line" if status.position == 1 else f"{_ordinal(status.position)} in line"
    limit = "" if status.timeout_s is None else f" of {status.timeout_s:g}"
    return f"waiting {status.waited_s:.0f} s{limit} for devices ({place}): {status.reason}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
