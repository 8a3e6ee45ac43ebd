"""The job queue's decisions: which queued job starts next, which can never run, and why a
job waits. Pure: jobs, leases and runners come in as values, the clock as ``now_s``.

Order: highest ``--priority`` first, then submission order. A job with ``--after ID`` waits
until job ID has ended successfully (and is cancelled when it failed or was cancelled); with
``--after-any ID`` until ID ended in any way; with ``--after-fail ID`` until ID failed or was
cancelled (and it is cancelled when ID succeeded). A held job keeps its place but is skipped.
A CPU job (``--gpus none``) waits for no device, so it is never held behind a job that waits
in the lease line. One job at a time waits in the lease line (the
``--wait`` queue of :mod:`xpulaunch.leases.wait_queue`), so queued jobs and ``--wait``
launches share one first-come-first-served line for devices, and the order of the queue
behind it can still change (priority, hold, cancel) until a job's turn comes.

Each user's jobs are started by that user's runner (a runner can only start processes as
itself); a user whose runner is not running does not hold the others up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping, Sequence


class JobState(str, Enum):
    QUEUED = "queued"
    HELD = "held"
    STARTING = "starting"  # its ``xpulaunch run`` started; not yet holding its devices
    RUNNING = "running"  # holds its devices (or runs on the CPU)
    DONE = "done"  # exit status 0
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)

    @property
    def pending(self) -> bool:
        """Not started yet: its place in the queue may still change."""
        return self in (JobState.QUEUED, JobState.HELD)


@dataclass(frozen=True, slots=True)
class Job:
    """One job of the queue, as its database row holds it. Times are wall-clock seconds."""

    id: int
    uid: int
    user: str
    state: JobState
    command: tuple[str, ...]  # PROGRAM and its arguments
    submitted_s: float
    priority: int = 0
    after: tuple[int, ...] = ()
    gpus: str = "auto"  # the --gpus it asked for
    wanted: tuple[str, ...] = ()  # labels of the devices its plan chose when submitted
    shares: bool = False  # --slots-per-gpu / --gpu-memory: a slot of each device
    started_s: float | None = None  # its xpulaunch run started
    leased_s: float | None = None  # holds its devices since
    ended_s: float | None = None
    pid: int | None = None  # its xpulaunch run
    devices: tuple[str, ...] = ()  # labels of the devices it holds
    exit_code: int | None = None
    reason: str | None = None  # starting: why its run waits; ended: how it ended
    cancel_requested_s: float | None = None
    grace_s: float = 10.0
    pid_ticks: int | None = None  # with pid, its run's identity (a reused pid has others)
    lease_job: str | None = None  # the lease's job id: its workers' XPULAUNCH_JOB_ID
    job_dir: str = ""  # where its folder is, for people (runners use the one its id names)
    name: str | None = None  # --name: usable wherever its id is (its user's jobs only)
    after_any: tuple[int, ...] = ()  # --after-any: once these ended, in any way
    after_fail: tuple[int, ...] = ()  # --after-fail: only if these failed (or were cancelled)
    array_first: int | None = None  # --array: the first job of its array (its own id: first)
    array_index: int | None = None  # its XPULAUNCH_ARRAY_INDEX

    @property
    def on_cpu(self) -> bool:
        """``--gpus none``: it leases no device, so it never waits in the lease line."""
        return self.gpus.strip().lower() == "none"

    @property
    def waited_s(self) -> float | None:
        """From submission to its devices (so far, while it waits)."""
        end = self.leased_s if self.leased_s is not None else self.ended_s
        return None if end is None else max(end - self.submitted_s, 0.0)

    def runtime_s(self, now_s: float) -> float | None:
        if self.leased_s is None:
            return None
        end = self.ended_s if self.ended_s is not None else now_s
        return max(end - self.leased_s, 0.0)


def queue_order(jobs: Iterable[Job]) -> list[Job]:
    """Jobs not started yet, in the order they would start."""
    return sorted((j for j in jobs if j.state.pending), key=lambda j: (-j.priority, j.id))


@dataclass(frozen=True, slots=True)
class Dependency:
    """Where a job's ``--after`` jobs stand: ``ready``, or else what it waits for, or (with
    ``never``) why it can never run."""

    ready: bool
    text: str = ""
    never: bool = False


class After(str, Enum):
    """How a job depends on another: ``--after``, ``--after-any``, ``--after-fail``."""

    OK = "after"
    ANY = "after-any"
    FAIL = "after-fail"


def dependencies(job: Job) -> list[tuple[After, int]]:
    """Each job ``job`` waits for, and how."""
    return [
        *((After.OK, i) for i in job.after),
        *((After.ANY, i) for i in job.after_any),
        *((After.FAIL, i) for i in job.after_fail),
    ]


def depends_on(job: Job) -> tuple[int, ...]:
    return tuple(i for _, i in dependencies(job))


def _met(kind: After, other: Job) -> bool | None:
    """Whether ``other``'s state satisfies ``kind``: True, False (never will), None (yet)."""
    if not other.state.ended:
        return None
    if kind is After.ANY:
        return True
    succeeded = other.state is JobState.DONE
    return succeeded if kind is After.OK else not succeeded


def dependency(job: Job, by_id: Mapping[int, Job]) -> Dependency:
    waiting = []
    for kind, other_id in dependencies(job):
        other = by_id.get(other_id)
        if other is None:
            return Dependency(False, f"job {other_id} is not in the queue any more", never=True)
        met = _met(kind, other)
        if met:
            continue
        if met is False:
            status = "" if other.exit_code is None else f" (exit status {other.exit_code})"
            if other.state is JobState.DONE:
                how = "succeeded"
            elif other.state is JobState.CANCELLED:
                how = "was cancelled"
            else:
                how = f"failed{status}"
            return Dependency(False, f"--{kind.value} {other_id}: job {other_id} {how}", never=True)
        word = "" if kind is After.OK else f" to {'end' if kind is After.ANY else 'fail'}"
        waiting.append(f"job {other_id}{word} ({other.state.value})")
    if waiting:
        return Dependency(False, "after " + ", ".join(waiting))
    return Dependency(True)


def never_runs(jobs: Sequence[Job]) -> list[tuple[Job, str]]:
    """Jobs not started whose ``--after`` job failed, was cancelled or is gone, and why."""
    by_id = {j.id: j for j in jobs}
    deps = ((job, dependency(job, by_id)) for job in jobs if job.state.pending and depends_on(job))
    return [(job, dep.text) for job, dep in deps if dep.never]


def next_to_start(jobs: Sequence[Job], runner_uids: Collection[int]) -> Job | None:
    """The job to start now, or None while one waits in the lease line already.

    Only jobs whose user has a live runner count: anyone else's job waits for that user's
    runner and holds nobody up. A CPU job (``--gpus none``) leases nothing: it is not held
    behind a job waiting in the lease line, and it holds none up while it starts. ``jobs``
    must hold every job that an ``--after`` names."""
    in_line = any(
        j.state is JobState.STARTING and j.uid in runner_uids and not j.on_cpu for j in jobs
    )
    by_id = {j.id: j for j in jobs}
    for job in queue_order(jobs):
        ours = job.state is JobState.QUEUED and job.uid in runner_uids
        if ours and (job.on_cpu or not in_line) and dependency(job, by_id).ready:
            return job
    return None


@dataclass(frozen=True, slots=True)
class Holding:
    """Devices leased by one process: a queue job's run, or any other launch."""

    pid: int
    user: str
    devices: tuple[str, ...]  # labels, or unit keys where no label is known
    job: int | None = None  # the queue job whose run holds them
    slot: bool = False  # a slot of a shared device


@dataclass(frozen=True, slots=True)
class Waiter:
    """A launch waiting in the lease line with ``--wait`` (not a queue job)."""

    pid: int
    user: str
    since_s: float
    command: tuple[str, ...]
    reason: str | None


class QueueView:
    """Why each job of one look at the queue waits (computed once for all of them: a queue
    of a thousand jobs is listed in one pass)."""

    def __init__(
        self,
        jobs: Sequence[Job],
        *,
        holdings: Sequence[Holding] = (),
        waiters: Sequence[Waiter] = (),
        runner_uids: Collection[int] = (),
        draining_uids: Collection[int] = (),
    ) -> None:
        self.jobs = jobs
        self.holdings = holdings
        self.waiters = waiters
        self.runner_uids = runner_uids
        self.draining_uids = draining_uids
        self._by_id = {j.id: j for j in jobs}
        self._ready = [
            j
            for j in queue_order(jobs)
            if j.state is JobState.QUEUED and dependency(j, self._by_id).ready
        ]
        self._rank = {j.id: i for i, j in enumerate(self._ready)}
        self._starting = [j for j in jobs if j.state is JobState.STARTING and not j.on_cpu]

    def why(self, job: Job) -> str:
        """Why ``job`` has not got its devices yet, or how it ended; "" for a running job
        (unless no runner of its user runs, to record its end)."""
        if job.state.ended:
            return job.reason or ""
        if job.state is JobState.RUNNING:
            if job.uid not in self.runner_uids:  # it may have ended since: nobody noted it
                return f"no runner of user {job.user} watches it: xpulaunch runner records its end"
            return ""
        if job.state is JobState.HELD:
            return f"held: xpulaunch release {job.id}"
        if job.state is JobState.STARTING:
            return _starting(job, self.holdings, self.waiters)
        return self._queued(job)

    def _queued(self, job: Job) -> str:
        dep = dependency(job, self._by_id)
        if not dep.ready:
            return dep.text
        if job.uid in self.draining_uids:
            return f"the runner of user {job.user} drains: xpulaunch runner --resume"
        if job.uid not in self.runner_uids:
            return f"no runner of user {job.user} is running: xpulaunch runner"
        ahead = self._ready[: self._rank.get(job.id, 0)]
        if job.on_cpu:  # it waits for no device, nor behind a job that does
            ahead = [j for j in ahead if j.on_cpu]
        parts = []
        if self._starting and not job.on_cpu:
            parts.append(f"job {self._starting[0].id} waits for devices first")
        if ahead:
            shown = ", ".join(str(j.id) for j in ahead[:3]) + (", ..." if len(ahead) > 3 else "")
            many = "s" if len(ahead) != 1 else ""
            parts.append(f"{len(ahead)} queued job{many} first ({shown})")
        return "queued: " + ("; ".join(parts) if parts else "starts next")


_EARLIER = re.compile(r"(\d+) earlier launch")


def _starting(job: Job, holdings: Sequence[Holding], waiters: Sequence[Waiter]) -> str:
    reason = job.reason
    if reason is None:
        return "starting"
    earlier = _EARLIER.search(reason)
    if earlier is not None:
        count = int(earlier.group(1))
        ahead = waiters[:count]
        who = "; ".join(f"w{w.pid} ({w.user})" for w in ahead)
        return f"waiting behind {count} earlier launch(es) in the lease line" + (
            f": {who}" if who else ""
        )
    return f"waiting for {wanted_text(job)}: " + (_holdings_text(holdings) if holdings else reason)


def wanted_text(job: Job) -> str:
    """``2 devices``, ``nvidia 0, 1``, ``a free device``; with a slot for sharing jobs."""
    gpus = job.gpus.strip().lower()
    slot = "a slot on " if job.shares else ""
    if gpus.isascii() and gpus.isdigit():
        count = int(gpus)
        return f"{slot}{count} device{'s' if count != 1 else ''}"
    if gpus == "auto":
        return f"{slot}a free device"
    return slot + (short_devices(job.wanted) or gpus)


def _holdings_text(holdings: Sequence[Holding]) -> str:
    """``nvidia 0, 1 leased by job 17; nvidia 2 shared by job 18, job 19``."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for holding in holdings:
        who = f"pid {holding.pid} ({holding.user})" if holding.job is None else f"job {holding.job}"
        verb = "shared by" if holding.slot else "leased by"
        grouped.setdefault((short_devices(holding.devices), verb), []).append(who)
    return "; ".join(
        f"{devices} {verb} {', '.join(who)}" for (devices, verb), who in grouped.items()
    )


_LABEL = re.compile(r"^(?P<vendor>[a-z]+) (?P<index>\d+)(?: \([^)]*\))?(?P<rest>.*)$")


def short_devices(labels: Sequence[str]) -> str:
    """``nvidia 0 (0000:17:00.0)``, ``nvidia 1 (...)`` -> ``nvidia 0, 1``; a tile ``intel 0.1``."""
    groups: dict[str, list[str]] = {}
    for label in labels:
        match = _LABEL.match(label)
        if match is None:
            groups.setdefault(label, [])
            continue
        rest = match["rest"].strip()
        index = match["index"]
        if rest.startswith("tile "):
            index += "." + rest.removeprefix("tile ")
        elif rest:
            index += " " + rest
        groups.setdefault(match["vendor"], []).append(index)
    return ", ".join(f"{name} {', '.join(ids)}" if ids else name for name, ids in groups.items())


def format_duration(seconds: float | None) -> str:
    """``12s``, ``3m04s``, ``2h05m``, ``3d04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    total = int(seconds)
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"
