"""One look at a lock directory's queue, for ``xpulaunch queue`` and ``top``: its jobs, the
launches waiting with ``--wait``, who holds which device, and each row as people read it.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath

from xpulaunch.jobqueue.actions import lease_manager, user_name
from xpulaunch.jobqueue.files import drain_requested, live_runners
from xpulaunch.jobqueue.policy import Holding, Job, JobState, QueueView, Waiter, format_duration
from xpulaunch.jobqueue.store import Store
from xpulaunch.leases.lock_directory import LockDirectory
from xpulaunch.leases.manager import LeaseRecord, StatusReport
from xpulaunch.leases.slots import SlotRecord

SCHEMA = "xpulaunch.queue/1"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The queue and the leases of one lock directory at ``now_s``."""

    lock_dir: str
    shared: bool
    now_s: float
    jobs: tuple[Job, ...] = ()
    waiters: tuple[Waiter, ...] = ()
    holdings: tuple[Holding, ...] = ()
    runners: Mapping[int, int] = field(default_factory=dict)  # uid -> pid
    leases: StatusReport | None = None
    problems: tuple[str, ...] = ()  # other users' records that could not be read
    draining: frozenset[int] = frozenset()  # uids whose runner drains (runner --drain)

    @property
    def view(self) -> QueueView:
        return QueueView(
            self.jobs,
            holdings=self.holdings,
            waiters=self.waiters,
            runner_uids=set(self.runners),
            draining_uids=self.draining,
        )


def take(directory: LockDirectory, env: Mapping[str, str], *, ended: bool = False) -> Snapshot:
    """Read the queue (active jobs, with ``ended`` every job) and the leases."""
    store = Store.open(directory, env, create=False)
    jobs: list[Job] = []
    problems: list[str] = []
    if store is not None:
        with store:
            jobs = store.jobs(ended=True) if ended else store.with_dependencies()
            problems = store.problems
    report = lease_manager(directory).status()
    running = {j.pid: j for j in jobs if j.pid and j.state in _HOLDING_STATES}
    uids = {j.uid for j in jobs if not j.state.ended}
    return Snapshot(
        lock_dir=str(directory.root),
        shared=directory.shared,
        now_s=time.time(),
        jobs=tuple(jobs),
        waiters=tuple(_waiters(report, running)),
        holdings=tuple(holdings(report, running)),
        runners=live_runners(directory),
        leases=report,
        problems=tuple(problems),
        draining=frozenset(uid for uid in uids if drain_requested(directory, uid)),
    )


_HOLDING_STATES = (JobState.STARTING, JobState.RUNNING)


def holdings(report: StatusReport, running: Mapping[int, Job]) -> list[Holding]:
    """Who holds which device, one entry per holding process; a queue job's devices by its
    labels, any other launch's by unit key."""
    grouped: dict[tuple[int, bool], list[str]] = {}
    users: dict[int, str] = {}
    entries: list[tuple[LeaseRecord | SlotRecord, bool]] = [(x, False) for x in report.leases]
    for entry, is_slot in [*entries, *((slot, True) for slot in report.slots)]:
        pid = entry.holder.pid if entry.holder else 0
        users[pid] = entry.holder.user if entry.holder else "?"
        grouped.setdefault((pid, is_slot), []).append(entry.key)
    found = []
    for (pid, is_slot), keys in grouped.items():
        job = running.get(pid)
        devices = tuple(job.devices) if job is not None and job.devices else tuple(keys)
        found.append(Holding(pid, users[pid], devices, job.id if job else None, is_slot))
    return found


def _waiters(report: StatusReport, running: Mapping[int, Job]) -> list[Waiter]:
    return [
        Waiter(w.holder.pid, w.holder.user, w.holder.since_s, w.holder.argv, w.waiting_for)
        for w in report.waiting
        if w.holder is not None and w.holder.pid not in running  # a queue job's: shown as it
    ]


def shown_state(job: Job) -> str:
    """``waiting`` for a started run that waits in the lease line; the state otherwise."""
    if job.state is JobState.STARTING and job.reason:
        return "waiting"
    return job.state.value


def job_record(job: Job, view: QueueView, now_s: float) -> dict[str, object]:
    """One job in the ``xpulaunch.queue/1`` document."""
    waited = job.waited_s if job.waited_s is not None else now_s - job.submitted_s
    return {
        "id": job.id,
        "name": job.name,
        "user": job.user,
        "state": shown_state(job),
        "priority": job.priority,
        "after": list(job.after),
        "after_any": list(job.after_any),
        "after_fail": list(job.after_fail),
        "array": None if job.array_first is None else job.array_first,
        "array_index": job.array_index,
        "gpus": job.gpus,
        "devices": list(job.devices),
        "submitted": _iso(job.submitted_s),
        "waited_s": round(max(waited, 0.0), 3),
        "runtime_s": _round(job.runtime_s(now_s)),
        "exit_code": job.exit_code,
        "reason": view.why(job) or None,
        "pid": job.pid,
        "command": list(job.command),
    }


def waiter_record(waiter: Waiter, now_s: float) -> dict[str, object]:
    """A ``--wait`` launch in the document: id ``w<pid>``."""
    return {
        "id": f"w{waiter.pid}",
        "name": None,
        "user": waiter.user,
        "state": "waiting",
        "priority": None,
        "after": [],
        "after_any": [],
        "after_fail": [],
        "array": None,
        "array_index": None,
        "gpus": None,
        "devices": [],
        "submitted": _iso(waiter.since_s),
        "waited_s": round(max(now_s - waiter.since_s, 0.0), 3),
        "runtime_s": None,
        "exit_code": None,
        "reason": f"xpulaunch --wait: {waiter.reason or 'its turn'}",
        "pid": waiter.pid,
        "command": list(waiter.command),
    }


def document(snapshot: Snapshot) -> dict[str, object]:
    """The ``xpulaunch.queue/1`` document of ``xpulaunch queue --json``."""
    view = snapshot.view
    records = [job_record(j, view, snapshot.now_s) for j in snapshot.jobs]
    records += [waiter_record(w, snapshot.now_s) for w in snapshot.waiters]
    return {
        "schema": SCHEMA,
        "lock_dir": snapshot.lock_dir,
        "runners": runner_names(snapshot),
        "draining": document_draining(snapshot),
        "jobs": records,
    }


HEADER = ("ID", "USER", "STATE", "DEVICES", "WAITED", "RUNTIME", "EXIT", "COMMAND")


def table_rows(snapshot: Snapshot) -> list[tuple[tuple[str, ...], str]]:
    """Each job as table cells (:data:`HEADER`) and the line saying why it waits or how it
    ended ("" for none); ``--wait`` launches after the queue's jobs."""
    view = snapshot.view
    now_s = snapshot.now_s
    rows: list[tuple[tuple[str, ...], str]] = []
    for job in snapshot.jobs:
        waited = job.waited_s if job.waited_s is not None else now_s - job.submitted_s
        cells = (
            job_label(job),
            job.user,
            shown_state(job),
            _devices(job.devices),
            format_duration(waited),
            format_duration(job.runtime_s(now_s)),
            "" if job.exit_code is None else str(job.exit_code),
            command_text(job.command),
        )
        rows.append((cells, "" if job.state is JobState.DONE else view.why(job)))
    for waiter in snapshot.waiters:
        cells = (
            f"w{waiter.pid}",
            waiter.user,
            "waiting",
            "-",
            format_duration(now_s - waiter.since_s),
            "-",
            "",
            command_text(waiter.command),
        )
        rows.append((cells, f"xpulaunch --wait: {waiter.reason or 'its turn'}"))
    return rows


def job_label(job: Job) -> str:
    """``12``, ``12 train`` (its ``--name``), ``14 sweep[2]`` (an array's index 2)."""
    name = "" if job.name is None else f" {job.name}"
    index = "" if job.array_index is None else f"[{job.array_index}]"
    return f"{job.id}{name}{index}" if name or not index else f"{job.id} {index}"


def command_text(argv: Sequence[str]) -> str:
    """``python train.py --lr 1``: the program's own name, then its arguments."""
    if not argv:
        return "?"
    return shlex.join([PurePosixPath(argv[0]).name, *argv[1:]])


def _devices(labels: Sequence[str]) -> str:
    from xpulaunch.jobqueue.policy import short_devices

    return short_devices(labels) or "-"


def runner_names(snapshot: Snapshot) -> dict[str, int]:
    """User name -> pid of each live runner."""
    return {_user_of(snapshot, uid): pid for uid, pid in snapshot.runners.items()}


def document_draining(snapshot: Snapshot) -> list[str]:
    """The users whose runner drains."""
    return sorted(_user_of(snapshot, uid) for uid in snapshot.draining)


def _user_of(snapshot: Snapshot, uid: int) -> str:
    found = next((job.user for job in snapshot.jobs if job.uid == uid), None)
    return user_name(uid) if found is None else found


def _iso(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s).astimezone().isoformat(timespec="seconds")


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
