"""Device leases across processes: one ``flock`` per unit key in a lock directory.

How a lease works:

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
  session and marker, as the guardian would), so the devices are free when ``run`` returns
  without waiting for the guardian to exit (see ``docs/DECISIONS.md``).
* Lock files are never deleted: unlinking a lock file that others have open puts later lockers
  on another inode and breaks mutual exclusion (py-filelock #31).
* Who holds a unit is in a side file ``unit-<escaped key>.holder``, written after the lock is
  taken. Readers find holders by *trying* the lock; a side file whose lock is free is stale and
  ignored, so a reused pid cannot fake a holder: the kernel lock is the truth.
* Reading the leases, planning and locking happen under the directory-wide allocation lock
  ``allocate.lock``, so two launches racing for ``--gpus 1`` never pick the same unit. Every
  probe of a lock (``status`` too) happens under it, so a probe never fails an allocation.

Why plain ``fcntl.flock`` and not the ``filelock`` package: a lease's locked descriptor must
pass to the workers through ``pass_fds`` so that the lease outlives a SIGKILLed supervisor,
while ``filelock.FileLock`` keeps its descriptor private and non-inheritable and releases with
``LOCK_UN``; on a filesystem without flock it falls back to ``SoftFileLock`` (4.x) or retries
forever (3.x takes any other flock error for contention), where we raise a clear LeaseError.
"""

from __future__ import annotations

import errno
import os
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from xpulaunch.core.selection import HELD_ADVICE
from xpulaunch.errors import DeviceBusyError, SelectionError
from xpulaunch.leases import slots
from xpulaunch.leases.lock_directory import LockDirectory, allocation_lock_timeout_s
from xpulaunch.leases.lock_files import (
    HOLDER_SUFFIX,
    LOCK_SUFFIX,
    UNIT_PREFIX,
    HolderInfo,
    holder_file_name,
    key_of_lock_file,
    lock_file_name,
)
from xpulaunch.model import DeviceShare, Plan

if TYPE_CHECKING:
    from xpulaunch.leases.wait_queue import WaiterRecord, WaitStatus

# Plans a launch with the given units unavailable (unit key -> who holds it).
PlanFn = Callable[[Mapping[str, str]], Plan]
T = TypeVar("T")  # what a planner returns: a Plan, or a richer value holding one


def with_note(planned: Any, note: str) -> Any:
    """``noted`` for a planner that returns the :class:`~xpulaunch.model.Plan` itself."""
    plan = the_plan(planned)
    return replace(plan, notes=(*plan.notes, note))


def the_plan(planned: Any) -> Plan:
    """``plan_of`` for a planner that returns the :class:`~xpulaunch.model.Plan` itself."""
    return cast("Plan", planned)


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
        return Path(self.root)

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
    slots: tuple[slots.SlotRecord, ...] = ()  # devices shared by small jobs, one per slot

    def holders(self) -> list[tuple[str, HolderInfo]]:
        """(unit key, holder) of every lease and every slot whose holder is known: which job
        holds which device, for ``top`` and ``devices --processes``."""
        held = [(r.key, r.holder) for r in self.leases] + [(r.key, r.holder) for r in self.slots]
        return [(key, holder) for key, holder in held if holder is not None]


class LeaseManager:
    """Atomic allocation of leases in one lock directory, with a FIFO queue for ``--wait``.

    The directory is the CLI's (:meth:`LockDirectory.resolve`): ``lock_dir`` when given, else
    ``XPULAUNCH_LOCK_DIR`` of ``env`` (default: this process's environment), both shared by
    several users (files readable and writable by all); else the private per-user directory.
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
        env = os.environ if env is None else env
        self.directory = LockDirectory.resolve(lock_dir, env, uid=uid)
        allocation_lock_timeout_s()  # a bad XPULAUNCH_LOCK_TIMEOUT is refused at once
        self._clock = clock
        self._sleep = sleep
        self._poll_interval_s = poll_interval_s

    @property
    def lock_dir(self) -> Path:
        return self.directory.path

    def view(self) -> LeaseView:
        """Who holds what now, read once (reserves nothing): for a caller that plans for
        several shares, or as if some of its own jobs had gone (the model router)."""
        from xpulaunch.leases.wait_queue import WaitQueue

        if not self.directory.ensure(create=False):
            return LeaseView({}, {})
        with self.directory.allocation_lock():
            held = self._held()
            sharers = slots.sharers_by_key(self.directory, held)
            waiting = WaitQueue(self.directory).live()
        wanted = tuple(w for w in waiting if w.wants and not w.stopped and w.ignored is None)
        return LeaseView(held, {k: tuple(found) for k, found in sharers.items()}, wanted)

    def unavailable(self, share: DeviceShare | None = None) -> dict[str, str]:
        """Unit key -> who holds it, now, for a job asking for ``share`` (None: devices
        alone), as for a dry run; reserves nothing."""
        if not self.directory.ensure(create=False):
            return {}
        with self.directory.allocation_lock():
            return slots.unavailable(self.directory, _describe(self._held()), share)

    def allocate(
        self,
        plan_fn: Callable[[Mapping[str, str]], T],
        *,
        plan_of: Callable[[T], Plan] = the_plan,
        shared: bool = False,
        wait: bool = False,
        wait_timeout_s: float | None = None,
        on_wait: Callable[[WaitStatus], None] | None = None,
        command: Sequence[str] | None = None,
        share: DeviceShare | None = None,
    ) -> tuple[T, Lease]:
        """Plan with the leased units excluded and lock the plan's units, atomically.

        ``plan_fn(unavailable)`` must be pure and quick (it runs under the allocation lock:
        probe, and ask a binary which build it is, before);
        it raises SelectionError when too few units are free, DeviceBusyError for a leased
        explicit unit. ``shared``: explicitly named units are used even when leased, auto/N
        still avoid leased units, and nothing is locked. ``wait``: queue, first come first
        served, while the request fails because of leases. ``command``: the holder's command
        line for ``status`` (default: this process's argv). ``share``: the job shares its
        devices with other small jobs (a slot of each; see :mod:`xpulaunch.leases.slots`).
        ``plan_of``: the :class:`~xpulaunch.model.Plan` in what ``plan_fn`` returns (a llama
        plan holds one), which comes back whole with the lease.
        """
        holder = HolderInfo.of_this_process(uuid.uuid4().hex[:12], command)
        unleased = self._plan_unleased(plan_fn, plan_of, share)
        if unleased is not None and not plan_of(unleased).lease_keys:
            return unleased, Lease((), (), holder.job_id, self.directory.root, shared=shared)
        self.directory.ensure(create=True)
        if not wait:
            with self.directory.allocation_lock():
                return self._allocate_now(plan_fn, plan_of, holder, shared=shared, share=share)

        from xpulaunch.leases.wait_queue import Blocked, wait_in_line

        def attempt() -> tuple[T, Lease] | Blocked:
            try:
                return self._allocate_now(plan_fn, plan_of, holder, shared=shared, share=share)
            except (SelectionError, DeviceBusyError) as exc:
                # shown by `xpulaunch status` and the wait line: not the advice to wait
                why = exc.cli_message().removesuffix(HELD_ADVICE)
                return Blocked(why, _wanted(plan_fn, plan_of))

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

    def preview(
        self,
        plan_fn: Callable[[Mapping[str, str]], T],
        share: DeviceShare | None = None,
        *,
        plan_of: Callable[[T], Plan] = the_plan,
        noted: Callable[[T, str], T] = with_note,
        shared: bool = False,
        wait: bool = False,
    ) -> T:
        """The plan :meth:`allocate` would make now, reserving nothing (a dry run); as there,
        a plan that leases no unit never reads the lock directory, ``shared`` uses a leased
        unit named explicitly, and ``wait``: a request that leases keep from being met now is
        the plan it would get once they end, with a note saying it would wait first
        (``noted`` adds a note to what ``plan_fn`` returns)."""
        unleased = self._plan_unleased(plan_fn, plan_of, share)
        if unleased is not None and not plan_of(unleased).lease_keys:
            return unleased
        try:
            return plan_fn(self.unavailable(share))
        except (SelectionError, DeviceBusyError) as exc:
            if shared and isinstance(exc, DeviceBusyError):
                return plan_fn({})  # a leased unit named explicitly: sharing it is the point
            if not wait:
                raise
            why = exc.cli_message().removesuffix(HELD_ADVICE)
        planned = plan_fn({})  # once the leases end (or the refusal waiting can't mend)
        return noted(planned, f"--wait: waits in line first ({why})")

    def _plan_unleased(
        self,
        plan_fn: Callable[[Mapping[str, str]], T],
        plan_of: Callable[[T], Plan],
        share: DeviceShare | None,
    ) -> T | None:
        """The plan made with nothing leased, outside the lock; None when it fails for want of
        a unit that is leased. A plan that leases no unit (the CPU, --gpus none) cannot meet
        any other launch, so it takes no lock at all and no stuck lock directory can hold it
        up. A failure here decides nothing: on a GPU host a leased device also looks busy (its
        holder's memory), so only a plan made with the leases known says why (leased by whom),
        and whether waiting can help."""
        try:
            return plan_fn({})
        except (SelectionError, DeviceBusyError):
            if not self.unavailable(share):
                raise  # nothing is leased: the request can never be met, also by waiting
            return None

    def status(self) -> StatusReport:
        """Current leases and waiting launches."""
        from xpulaunch.leases.wait_queue import WaitQueue

        directory = self.directory
        if not directory.ensure(create=False):
            return StatusReport(directory.path, directory.shared, exists=False)
        with directory.allocation_lock():
            held = self._held()
            waiting = tuple(WaitQueue(directory).live())
            shared = slots.shared_keys(directory, list(held))
            slot_leases = tuple(slots.records(directory))
        leases = tuple(
            LeaseRecord(key, info, info.alive() if info else None)
            for key, info in sorted(held.items())
            if key not in shared  # its holder file is an old one: the slots say who holds it
        )
        return StatusReport(
            directory.path, directory.shared, True, leases, waiting, slots=slot_leases
        )

    def _allocate_now(
        self,
        plan_fn: Callable[[Mapping[str, str]], T],
        plan_of: Callable[[T], Plan],
        holder: HolderInfo,
        *,
        shared: bool,
        share: DeviceShare | None,
    ) -> tuple[T, Lease]:
        unavailable = slots.unavailable(self.directory, _describe(self._held()), share)
        if shared:
            try:
                planned = plan_fn(unavailable)
            except DeviceBusyError:
                planned = plan_fn({})  # a leased unit named explicitly: sharing it is the point
            return planned, Lease((), (), holder.job_id, self.directory.root, shared=True)
        planned = plan_fn(unavailable)
        plan = plan_of(planned)
        if plan.share is not None:
            fds = slots.lock(self.directory, plan, holder)
            return planned, Lease(plan.lease_keys, fds, holder.job_id, self.directory.root)
        return planned, self._lock(plan.lease_keys, holder)

    def _lock(self, keys: Sequence[str], holder: HolderInfo) -> Lease:
        with ExitStack() as undo:
            fds: list[int] = []
            for key in keys:
                fd = self.directory.must_open(lock_file_name(key), os.O_RDONLY)
                undo.callback(os.close, fd)
                fds.append(fd)
                if not self.directory.try_lock(fd):
                    who = HolderInfo.from_dict(self.directory.read(holder_file_name(key)))
                    raise DeviceBusyError(
                        f"{key} was leased by {who.describe() if who else 'another process'} "
                        "while this launch was planning; try again, or wait with --wait"
                    )
            for key in keys:
                self.directory.write(holder_file_name(key), {"key": key, **holder.to_dict()})
            undo.pop_all()
        return Lease(tuple(keys), tuple(fds), holder.job_id, self.directory.root)

    def _held(self) -> dict[str, HolderInfo | None]:
        """Unit key -> holder (None: unknown) of every leased unit. Under the allocation lock."""
        held: dict[str, HolderInfo | None] = {}
        for name in self.directory.names(UNIT_PREFIX, LOCK_SUFFIX):
            if not self.directory.is_held(name):
                continue  # a stale holder file next to it is ignored
            record = self.directory.read(name[: -len(LOCK_SUFFIX)] + HOLDER_SUFFIX)
            key = key_of_lock_file(name) or str((record or {}).get("key", name))
            held[key] = HolderInfo.from_dict(record)
        return held


def _wanted(
    plan_fn: Callable[[Mapping[str, str]], T], plan_of: Callable[[T], Plan]
) -> tuple[str, ...]:
    """The units a waiting launch would take were nothing leased (none when even that plan
    fails: it waits for something else)."""
    try:
        return plan_of(plan_fn({})).lease_keys
    except (SelectionError, DeviceBusyError):
        return ()


@dataclass(frozen=True)
class LeaseView:
    """The leases of a lock directory as :meth:`LeaseManager.view` read them: whole-device
    holders by unit key, and the slot holders of the units small jobs share."""

    held: Mapping[str, HolderInfo | None]
    sharers: Mapping[str, tuple[slots.SlotRecord, ...]]
    waiting: tuple[WaiterRecord, ...] = ()  # launches in line that said which units they want

    def holders_of(self, key: str) -> set[str]:
        """The job ids holding ``key`` (its slot holders, or its one holder)."""
        if key in self.sharers:
            return {s.holder.job_id for s in self.sharers[key] if s.holder is not None}
        info = self.held.get(key)
        return {info.job_id} if info is not None else set()

    def wanted(self) -> dict[str, str]:
        """Unit key -> the launch waiting in line for it (the first that wants it)."""
        found: dict[str, str] = {}
        for waiter in self.waiting:
            who = waiter.holder.describe() if waiter.holder else waiter.owner
            for key in waiter.wants:
                found.setdefault(key, f"a launch waiting in line for it ({who})")
        return found

    def unavailable(
        self, share: DeviceShare | None = None, *, ignoring: Collection[str] = ()
    ) -> dict[str, str]:
        """The planner's ``unavailable`` for a job asking for ``share``, as if the jobs
        ``ignoring`` names (by job id) had released their leases."""

        def ignored(info: HolderInfo | None) -> bool:
            return info is not None and info.job_id in ignoring

        whole = {k: i for k, i in self.held.items() if k in self.sharers or not ignored(i)}
        sharers = {
            key: tuple(s for s in found if not ignored(s.holder))
            for key, found in self.sharers.items()
        }
        return slots.left_for(share, _describe(whole), sharers)


def _describe(held: Mapping[str, HolderInfo | None]) -> dict[str, str]:
    return {
        key: info.describe() if info else "another job (its holder record is missing)"
        for key, info in held.items()
    }
