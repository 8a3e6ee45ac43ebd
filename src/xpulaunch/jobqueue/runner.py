"""The runner: starts one user's queued jobs as their turn comes, and records how they end.

One runner per user and lock directory (``queue-runner-<uid>.lock``; a second one exits at
once). Each turn of its loop:

0. takes its store again if it was replaced (moved aside as a corrupt store's error says);
1. reads the events of its jobs' runs: a run that leased its devices is *running*, one that
   waits in the lease line says why; a run that ended is *done*, *failed* or *cancelled*;
2. kills the run of a cancelled job that outlives its grace;
3. cancels its queued jobs whose ``--after`` job failed;
4. starts the next job of the whole queue, if it is this user's
   (:func:`xpulaunch.jobqueue.policy.next_to_start`), as ``xpulaunch run --wait``, unless
   it drains (``xpulaunch runner --drain``: then it leaves once its running jobs ended);
5. runs the ``--notify`` command of each job of this user's that ended (``sh -c CMD``, as
   the user, in the job's environment and directory, killed after
   :data:`NOTIFY_TIMEOUT_S`; a failure is a line in its log, never the job's or the queue's).

Between turns it sleeps in ``select()`` on its wake-up FIFO and on a pidfd per running job,
so an idle runner costs nothing and a submit or a job's end wakes it at once; it looks more
often only while one of its jobs is starting. It never holds a lease itself: the runs do,
through the same planner and lease line as every other launch.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from xpulaunch.errors import QueueError
from xpulaunch.jobqueue import job_process
from xpulaunch.jobqueue.files import (
    NOTIFIED_NAME,
    NOTIFY_LOG,
    RunnerLock,
    WakePipe,
    drain_requested,
    job_folder,
    live_runners,
    notify,
    order_lock,
    read_spec,
)
from xpulaunch.jobqueue.job_process import JobProcess
from xpulaunch.jobqueue.policy import Job, JobState, never_runs, next_to_start
from xpulaunch.jobqueue.store import Store
from xpulaunch.jobqueue.user_store import StoreFull
from xpulaunch.leases.lock_directory import LockDirectory
from xpulaunch.processes import sd_notify

STARTING_POLL_S = 0.05  # while a run starts: how soon its lease is seen
WAITING_POLL_S = 0.1  # while a run waits in the lease line
FALLBACK_POLL_S = 0.5  # a job watched without a pidfd (old kernels)
IDLE_POLL_S = 5.0  # otherwise: other users' changes that missed the FIFO, dead runners
CANCEL_MARGIN_S = 10.0  # after a cancelled job's --grace, its run itself is killed
_MAX_FAILED_TURNS = 60
NOTIFY_TIMEOUT_S = (
    60.0  # a --notify command still running then is killed (XPULAUNCH_NOTIFY_TIMEOUT)
)
NOTIFY_POLL_S = 0.2  # while one runs: how soon its end is noted
NOTIFY_WINDOW_S = 86400.0  # a job that ended longer ago than this is not notified any more
_ENDED = tuple(s.value for s in JobState if s.ended)
Handler = Callable[[int, FrameType | None], Any] | int | None


class Runner:
    """Serves this user's jobs in ``directory`` until stopped or idle for ``idle_exit_s``."""

    def __init__(
        self,
        directory: LockDirectory,
        env: Mapping[str, str],
        *,
        idle_exit_s: float | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.directory = directory
        self.env = env
        self.uid = os.getuid()
        self.idle_exit_s = idle_exit_s
        self._log = log or _stderr
        self._processes: dict[int, JobProcess] = {}
        self._stopping = False
        self._wake: WakePipe | None = None
        self._seen: tuple[object, ...] | None = None  # the stores' stamps, live runners
        self._busy = True
        self._deadline_s: float | None = None  # a cancelled job's run is due to be killed
        self._cancels_seen: dict[int, float] = {}  # job id -> when we saw its cancel
        self._lock = RunnerLock(directory, self.uid)
        self._started_s = time.time()
        self._notifiers: list[_Notifier] = []
        self._considered: set[int] = set()  # ended jobs whose --notify was looked at
        self.notify_timeout_s = _notify_timeout(env)
        self.draining = False

    def serve(self) -> bool:
        """Run until stopped (SIGTERM, SIGINT) or idle; False when another runner runs."""
        lock = self._lock
        if not lock.acquire():
            return False
        try:
            store = Store.open(self.directory, self.env, create=True)
            if store is None:  # pragma: no cover - created above
                return True
            with store:
                self._wake = WakePipe(self.directory, self.uid)
                previous = self._handle_signals()
                try:
                    self._serve(store)
                finally:
                    for signum, handler in previous.items():
                        signal.signal(signum, handler)
        finally:
            for process in self._processes.values():
                process.close()
            if self._wake is not None:
                self._wake.close()
            lock.release()
        return True

    def _serve(self, store: Store) -> None:
        self._say(f"runner pid {os.getpid()} serves {self.directory.root}")
        self._adopt(store)
        sd_notify.ready(f"serving {self.directory.root}", self.env)  # Type=notify: ready
        idle_since_s = time.monotonic()
        failures = 0
        while not self._stopping:
            try:
                busy = self.turn(store)
                failures = 0
            except QueueError as exc:
                # A full disk is waited out: the ends it could not record are recorded
                # (with their own times) once there is room. Anything else, not for ever.
                failures += not isinstance(exc, StoreFull)
                self._say(f"error: {exc.cli_message()}")
                if failures >= _MAX_FAILED_TURNS:
                    raise
                busy = True
                time.sleep(1.0)
            if self.draining and not self._processes and not self._notifiers:
                self._say("drained: no job of ours runs; exiting (xpulaunch runner --resume)")
                return
            if busy:
                idle_since_s = time.monotonic()
            elif self._idle_for(idle_since_s):
                if self._leave(store):
                    self._say("idle: exiting (the next submit starts a runner again)")
                    return
                idle_since_s = time.monotonic()
            self._sleep()

    def _leave(self, store: Store) -> bool:
        """Give up the runner lock, unless a job came meanwhile. A submit commits its job
        before it looks for a runner, so it either finds the lock free (and starts one) or
        its job is seen here, after the lock is released."""
        self._lock.release()
        if not any(j.uid == self.uid for j in store.jobs()):
            return True
        return not self._lock.acquire()  # another runner took over: it has the job

    def _idle_for(self, since_s: float) -> bool:
        return self.idle_exit_s is not None and time.monotonic() - since_s >= self.idle_exit_s

    def turn(self, store: Store) -> bool:
        """One turn of the loop; whether any job of this user is still active.

        The queue is read only when something may have changed: a job of ours moved, someone
        committed to a user's store (its header's change counter), a runner came or went, or
        a cancelled job's grace ran out. So an idle runner with a long queue of held jobs
        costs a few small reads and lock probes a turn, not a read of every job."""
        changed = False
        if store.reopen_if_replaced():
            self._say(f"{store.path} was replaced: using the new one")
            changed = True
        changed |= self._watch(store)
        self._reap_notifiers()
        draining = drain_requested(self.directory, self.uid)
        if draining != self.draining:
            self.draining = draining
            self._say("draining: starting no job" if draining else "resumed: starting jobs")
        runners = live_runners(self.directory)
        starters = {uid for uid in runners if not drain_requested(self.directory, uid)}
        seen = (store.data_version(), tuple(sorted(runners)), tuple(sorted(starters)))
        due = self._deadline_s is not None and time.monotonic() >= self._deadline_s
        if not changed and not due and seen == self._seen:
            return self._busy
        jobs = store.with_dependencies()
        mine = [j for j in jobs if j.uid == self.uid]
        self._escalate(mine)
        changed |= self._drop_never_runnable(store, jobs)  # --after may name anyone's job
        if not draining:
            changed |= self._start_next(store, starters)
        self._notify_ended(store)
        if changed:
            notify(self.directory)
        # A turn that changed something is followed by a full one: what we did may let the
        # next job start.
        self._seen = None if changed else (store.data_version(), *seen[1:])
        self._busy = (
            bool(self._processes) or bool(self._notifiers) or any(not j.state.ended for j in mine)
        )
        return self._busy

    def _notify_ended(self, store: Store) -> None:
        """Start the ``--notify`` command of each job of ours that ended (within
        :data:`NOTIFY_WINDOW_S`: also one cancelled while no runner of ours ran) and has not
        been notified (a ``notified`` file in its folder, made first: no runner of ours runs
        it again)."""
        if store.own is None:
            return
        marks = ", ".join("?" for _ in _ENDED)
        ended = store.own.select(
            f"WHERE state IN ({marks}) AND ended_s >= ?",
            [*_ENDED, self._started_s - NOTIFY_WINDOW_S],
        )
        for job in ended:
            if job.id in self._considered:
                continue
            self._considered.add(job.id)
            folder = job_folder(self.directory, self.uid, job.id)
            if os.path.lexists(folder / NOTIFIED_NAME):
                continue
            try:
                spec = read_spec(folder, self.uid)
            except QueueError:
                continue
            if not spec.notify:
                continue
            try:
                os.close(os.open(folder / NOTIFIED_NAME, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except OSError:
                continue  # notified already, or the folder is gone
            self._start_notifier(job, spec.notify, spec.env, spec.cwd, folder)

    def _start_notifier(
        self, job: Job, command: str, env: Mapping[str, str], cwd: str, folder: Any
    ) -> None:
        variables = {
            "XPULAUNCH_JOB_ID": str(job.id),
            "XPULAUNCH_QUEUE_JOB": str(job.id),
            "XPULAUNCH_JOB_NAME": job.name or "",
            "XPULAUNCH_JOB_STATE": job.state.value,
            "XPULAUNCH_JOB_EXIT_CODE": "" if job.exit_code is None else str(job.exit_code),
            "XPULAUNCH_QUEUE_DIR": str(self.directory.root),
        }
        try:
            fd = os.open(folder / NOTIFY_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "ab") as log:
                process = subprocess.Popen(
                    ["sh", "-c", command],
                    env={**env, **variables},
                    cwd=cwd if os.path.isdir(cwd) else "/",
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            self._say(f"job {job.id}: --notify could not start: {exc}")
            return
        deadline_s = time.monotonic() + self.notify_timeout_s
        self._notifiers.append(_Notifier(job.id, process, deadline_s))

    def _reap_notifiers(self) -> None:
        """Note the ``--notify`` commands that ended (a failure in the log), kill those past
        :data:`NOTIFY_TIMEOUT_S` (their whole session)."""
        left = []
        for notifier in self._notifiers:
            code = notifier.process.poll()
            if code is None and time.monotonic() >= notifier.deadline_s:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(notifier.process.pid, signal.SIGKILL)
                notifier.process.wait()
                self._say(
                    f"job {notifier.job_id}: --notify still ran after "
                    f"{self.notify_timeout_s:g} s (XPULAUNCH_NOTIFY_TIMEOUT); killed"
                )
            elif code is None:
                left.append(notifier)
            elif code != 0:
                self._say(
                    f"job {notifier.job_id}: --notify failed (exit status {code}); its output "
                    f"is in {NOTIFY_LOG} of the job's folder"
                )
        self._notifiers = left

    def _watch(self, store: Store) -> bool:
        changed = False
        for job_id, process in list(self._processes.items()):
            changed |= self._read_events(store, process)
            if process.ended():
                if process.ended_s is None:  # when it was first seen gone: not a retry's time
                    process.ended_s = time.time()
                changed |= self._read_events(store, process)  # its last words
                self._finish(store, process)
                process.close()
                del self._processes[job_id]
                self._cancels_seen.pop(job_id, None)
                changed = True
        return changed

    def _read_events(self, store: Store, process: JobProcess) -> bool:
        """Act on the run's new events: each is read once, so what they say is kept on the
        process first, and a lease whose record fails to be written (a full disk) is
        written at the next turn."""
        changed = False
        waited: str | None = None
        for record in process.events.read():
            kind = record.get("event")
            if kind == "lease_waited":
                process.waiting = True
                waited = str(record.get("reason") or "")
            elif kind == "lease_acquired":
                process.leased = True
                process.unrecorded = record
            elif kind == "stopped":
                process.stopped = record
        if waited is not None and process.unrecorded is None:
            with contextlib.suppress(StoreFull):  # only the reason shown while it waits
                store.update(process.job_id, reason=waited)
            changed = True
        if process.unrecorded is not None:
            changed |= self._leased(store, process.job_id, process.unrecorded)
            process.unrecorded = None
        return changed

    def _leased(self, store: Store, job_id: int, record: dict[str, object]) -> bool:
        devices = record.get("devices")
        labels = [str(d) for d in devices] if isinstance(devices, list) else []
        job = store.job(job_id)
        if job is None or job.state is not JobState.STARTING:
            return False
        with store.write():
            store.update(
                job_id,
                state=JobState.RUNNING,
                devices=labels,
                reason=None,
                leased_s=job_process.event_time_s(record) or time.time(),
                lease_job=str(record.get("job_id") or "") or None,
            )
        where = ", ".join(labels) or "the CPU"
        self._say(f"job {job_id} running on {where}")
        return True

    def _finish(self, store: Store, process: JobProcess) -> None:
        outcome = process.outcome()
        job = store.job(process.job_id)
        if job is None:
            return
        if job.cancel_requested_s is not None and outcome.exit_code != 0:
            state = JobState.CANCELLED
            reason = f"cancelled; {outcome.reason or 'stopped'}"
        elif outcome.exit_code == 0:
            state, reason = JobState.DONE, outcome.reason or "exit status 0"
        else:
            state, reason = JobState.FAILED, outcome.reason
        # When it ended, not when this is written (a retry, once a full disk has room).
        ended_s = job_process.event_time_s(process.stopped or {}) or process.ended_s or time.time()
        with store.write():
            store.end(job.id, state, reason, ended_s=ended_s, exit_code=outcome.exit_code)
        status = "unknown" if outcome.exit_code is None else str(outcome.exit_code)
        self._say(f"job {job.id} {state.value} (exit status {status}): {reason}")

    def _escalate(self, mine: list[Job]) -> None:
        """Kill the run of a cancelled job still there ``grace + margin`` after the cancel:
        its guardian then stops the workers and the leases end with them. Counted on the
        monotonic clock from when this runner saw the cancel (at once: the cancel wakes it),
        not from the wall-clock time it was made: a clock stepped forward (NTP, a resumed VM)
        would have the run killed while its workers still had their grace."""
        now_s = time.monotonic()
        self._deadline_s = None
        for job in mine:
            process = self._processes.get(job.id)
            if process is None or job.cancel_requested_s is None:
                continue
            seen_s = self._cancels_seen.setdefault(job.id, now_s)
            deadline_s = seen_s + job.grace_s + CANCEL_MARGIN_S
            if now_s < deadline_s:
                self._deadline_s = min(self._deadline_s or deadline_s, deadline_s)
            elif process.signal(signal.SIGKILL):
                self._say(f"job {job.id}: still running after its grace; killed")

    def _drop_never_runnable(self, store: Store, jobs: list[Job]) -> bool:
        doomed = [(job, why) for job, why in never_runs(jobs) if job.uid == self.uid]
        if not doomed:
            return False
        with store.write():
            for job, why in doomed:
                current = store.job(job.id)
                if current is not None and current.state.pending:
                    store.end(job.id, JobState.CANCELLED, f"never started: {why}")
                    self._say(f"job {job.id} cancelled: {why}")
        return True

    def _start_next(self, store: Store, runners: set[int]) -> bool:
        # Under the queue's order lock: another user's runner picking at the same time
        # would not see this one's pick (a store of its own) and start a job as well.
        with order_lock(self.directory), store.write():
            job = next_to_start(store.with_dependencies(), runners)
            if job is None or job.uid != self.uid:
                return False
            store.update(job.id, state=JobState.STARTING, started_s=time.time(), reason=None)
        try:
            spec = read_spec(job_folder(self.directory, self.uid, job.id), self.uid)
            process = job_process.start(job, spec, self.directory)
        except QueueError as exc:
            with store.write():
                store.end(job.id, JobState.FAILED, exc.cli_message())
            self._say(f"job {job.id} failed to start: {exc.cli_message()}")
            return True
        with store.write():
            store.update(job.id, pid=process.pid, pid_ticks=process.ticks)
            cancelled = (store.job(job.id) or job).cancel_requested_s is not None
        self._processes[job.id] = process
        self._say(f"job {job.id} started: pid {process.pid}")
        if cancelled and process.signal(signal.SIGTERM):
            # Cancelled while it started: `cancel` found no pid to signal, so its SIGTERM
            # (and the workers' --grace) comes from here. Whichever of the two commits
            # second sees the other's write, so the run gets exactly one SIGTERM.
            self._say(f"job {job.id}: cancelled while it started; stopping it (SIGTERM)")
        return True

    def _adopt(self, store: Store) -> None:
        """Take over this user's jobs that an earlier runner started."""
        for row in store.jobs():
            if row.uid != self.uid or row.state not in (JobState.STARTING, JobState.RUNNING):
                continue
            job = self._with_pid(store, row)
            if job is None:
                continue
            cancelled = row.pid is None and job.cancel_requested_s is not None
            try:
                spec = read_spec(job_folder(self.directory, self.uid, job.id), self.uid)
            except QueueError as exc:
                self._say(f"job {job.id}: cannot adopt it: {exc.cli_message()}")
                continue
            process = job_process.adopt(job, spec, self.directory)
            process.leased = job.state is JobState.RUNNING
            self._processes[job.id] = process
            self._say(f"job {job.id}: adopted its run, pid {job.pid}")
            if cancelled and process.signal(signal.SIGTERM):  # its cancel found no pid
                self._say(f"job {job.id}: cancelled while it started; stopping it (SIGTERM)")

    def _with_pid(self, store: Store, job: Job) -> Job | None:
        """The job with its run's pid; None when no run of it exists (an earlier runner
        died between marking it started and starting it: it goes back in line)."""
        if job.pid is not None:
            return job
        found = job_process.find_started(job.id, self.directory)
        with store.write():
            cancelled = (store.job(job.id) or job).cancel_requested_s is not None
            if found is None and cancelled:  # cancelled meanwhile: it never runs
                store.end(job.id, JobState.CANCELLED, "cancelled before its run started")
                return None
            if found is None:
                store.update(job.id, state=JobState.QUEUED, started_s=None)
                return None
            store.update(job.id, pid=found[0], pid_ticks=found[1])
            return store.job(job.id)

    def _sleep(self) -> None:
        assert self._wake is not None
        processes = list(self._processes.values())
        timeout_s = IDLE_POLL_S
        if any(p.pidfd is None for p in processes):
            timeout_s = FALLBACK_POLL_S
        if any(not p.leased and p.waiting for p in processes):
            timeout_s = WAITING_POLL_S
        if any(not p.leased and not p.waiting for p in processes):
            timeout_s = STARTING_POLL_S
        if self._notifiers:
            timeout_s = min(timeout_s, NOTIFY_POLL_S)
        if self._deadline_s is not None:
            timeout_s = max(min(timeout_s, self._deadline_s - time.monotonic()), 0.0)
        fds = [self._wake.fd, *(p.pidfd for p in processes if p.pidfd is not None)]
        select.select(fds, [], [], timeout_s)
        self._wake.drain()

    def _handle_signals(self) -> dict[int, Handler]:
        def stop(signum: int, frame: object) -> None:
            self._stopping = True
            if self._wake is not None:
                with contextlib.suppress(BlockingIOError):  # full: it wakes anyway
                    os.write(self._wake.fd, b"\0")

        return {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGINT)}

    def _say(self, text: str) -> None:
        self._log(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}")


@dataclass
class _Notifier:
    """A ``--notify`` command running."""

    job_id: int
    process: subprocess.Popen[bytes]
    deadline_s: float


def _notify_timeout(env: Mapping[str, str]) -> float:
    """``XPULAUNCH_NOTIFY_TIMEOUT`` seconds (a positive number), else the default."""
    try:
        value = float(env.get("XPULAUNCH_NOTIFY_TIMEOUT", "") or NOTIFY_TIMEOUT_S)
    except ValueError:
        return NOTIFY_TIMEOUT_S
    return value if 0 < value < float("inf") else NOTIFY_TIMEOUT_S


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
