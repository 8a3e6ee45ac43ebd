"""The supervisor's loop: one thread owns the worker table, so no lock guards a worker.

Everything that changes a worker happens on the thread running :meth:`Engine.run`: spawning
(so ``PR_SET_PDEATHSIG`` is tied to this long-lived thread), reading output, reaping,
signalling and restart decisions. Other threads, signal handlers included, only post a
callable to its :class:`~xpulaunch.supervisor.loop.Loop`, and read the snapshots it publishes.

The loop blocks in one ``selectors`` wait on: a wake-up pipe, every worker's stdout/stderr
pipe, and a pidfd per worker that turns readable when it exits. Timers (backoff, stop
deadlines, health checks) set the wait's timeout. Nothing polls while workers run quietly;
only a dying process tree is looked at again every ``RECHECK_S`` until it is gone.

Seams: each :class:`~xpulaunch.supervisor.worker.Worker` reports facts (spawned, exited, failed, an
event) to the engine as its :class:`~xpulaunch.supervisor.worker.WorkerOwner`; the engine decides
what they mean for the worker's :class:`~xpulaunch.supervisor.gang.Gang` (the restart unit, whose
phase changes only through :data:`~xpulaunch.supervisor.gang.TRANSITIONS`), with the pure
:func:`~xpulaunch.supervisor.restart.decide`. The processes a job left behind are found with
:func:`~xpulaunch.processes.procfs.find_job`; the record file hears of every worker
started (the guardian reads it if the supervisor dies), and the guardian's own death is
noticed and mended (:mod:`~xpulaunch.supervisor.guardian_keeper`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
from dataclasses import replace
from typing import TYPE_CHECKING

from xpulaunch.errors import LaunchError
from xpulaunch.events import (
    Event,
    GaveUp,
    Restarting,
    SignalForwarded,
    Stopped,
    Stopping,
    TimedOut,
    WorkerState,
)
from xpulaunch.leases.lock_files import LOCK_SUFFIX, UNIT_PREFIX, key_of_lock_file
from xpulaunch.processes.procfs import command_line, find_job, flock_sharers
from xpulaunch.processes.signals import (
    describe_returncode,
    signal_group,
    signal_name,
    signal_processes,
    with_cont,
)
from xpulaunch.supervisor.gang import FINAL_PHASES, Gang, GangEvent, Phase
from xpulaunch.supervisor.guardian_keeper import GuardianKeeper
from xpulaunch.supervisor.loop import Loop, StatusBoard
from xpulaunch.supervisor.restart import Action, Decision, Outcome, RestartMode, decide
from xpulaunch.supervisor.worker import START_FAILED_STATUS, Worker

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from concurrent.futures import Future
    from pathlib import Path

    from xpulaunch.joblog.logs import LogSink
    from xpulaunch.processes.cgroup import JobCgroup
    from xpulaunch.processes.guardian import GuardianHandle
    from xpulaunch.processes.procfs import JobProcess
    from xpulaunch.processes.records import JobRecord
    from xpulaunch.supervisor.guardian_keeper import StartGuardian
    from xpulaunch.supervisor.hang import HangWatch
    from xpulaunch.supervisor.spec import SupervisorSettings, WorkerSpec

TIMED_OUT_STATUS = 124  # GNU timeout's status for a command that ran out of time
RECHECK_S = 0.05  # how often a dying tree is looked at again (only while one is dying)

_DOWN_EVENT = {
    Action.RESTART: GangEvent.DOWN_RESTART,
    Action.GIVE_UP: GangEvent.DOWN_GIVE_UP,
    Action.DONE: GangEvent.DOWN_DONE,
}


class Engine:
    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        settings: SupervisorSettings,
        *,
        sink: LogSink,
        on_event: Callable[[Event], None] | None,
        clock: Callable[[], float],
        job_id: str,
        since_ticks: int,
        settle: Callable[[Sequence[str]], None] | None,
        guardian: GuardianHandle | None,
        record: JobRecord,
        run_dir: Path,
        remove_run_dir: bool = False,
        restart_guardian: StartGuardian | None = None,
        cgroup: JobCgroup | None = None,
    ) -> None:
        policy, lease_fds = settings.policy, settings.lease_fds
        self.policy, self.grace_s, self.clock = policy, settings.grace_s, clock
        self.settings = settings
        # Each attempt's TORCHELASTIC_ERROR_FILE (and heartbeat file) goes under run_dir, which
        # is removed at the end when remove_run_dir (a private one).
        self._run_dir, self._remove_run_dir = run_dir, remove_run_dir
        self.cgroup = cgroup
        self.sink, self._on_event, self._settle = sink, on_event, settle
        self.job_id, self.since_ticks = job_id, since_ticks
        self.record = record
        self.loop = Loop(clock)
        self.workers = [
            Worker(
                spec,
                self,
                loop=self.loop,
                sink=sink,
                job_id=job_id,
                run_dir=run_dir,
                heartbeat=settings.heartbeat,
                cgroup=cgroup,
            )
            for spec in specs
        ]
        self.hangs: HangWatch | None = None
        if settings.hang_timeout_s is not None:  # the watch, and py-spy's lookup, only when asked
            from xpulaunch.supervisor.hang import HangWatch

            self.hangs = HangWatch(
                self, self.loop, sink, settings.hang_timeout_s, heartbeat=settings.heartbeat
            )
        self._timed_out = False
        groups = [self.workers] if policy.gang else [[w] for w in self.workers]
        self.gangs = [Gang(workers) for workers in groups]
        self._gang_of = {w.name: gang for gang in self.gangs for w in gang.workers}
        self._to_reap: set[Worker] = set()
        self._stop_signal: int | None = None
        self._stopped_by_signal = False
        self._stop_requests = 0
        self.launch_error: str | None = None
        self._status: int | None = None
        self._crash: BaseException | None = None
        self.board = StatusBoard([w.status() for w in self.workers])  # for other threads
        # Our own descriptors of the leases' open file descriptions: a new guardian gets them,
        # and with release_leases they are unlocked at the end (last: nothing to close if an
        # earlier step failed). Not the caller's numbers: those may be closed
        # (Lease.release) and reused meanwhile.
        self._lease_fds = tuple(os.dup(fd) for fd in lease_fds)
        self._release = settings.release_leases
        self.guardian = GuardianKeeper(
            guardian,
            restart_guardian,
            lease_fds=self._lease_fds,
            record=record,
            say=self.sink.message,
        )

    # -- called from any thread ----------------------------------------------------------
    def request_stop(self, signum: int, grace_s: float | None, *, by_signal: bool = True) -> None:
        """``by_signal`` False: the caller asked (``Supervisor.stop()``), so a job that ends
        without a failure ends with status 0, not 128 + ``signum``."""
        cause = "signal" if by_signal else "stop"
        self.loop.post(lambda: self._stop_all(signum, grace_s, cause))

    def fail_gangs(self, reason: str, exit_code: int) -> None:
        """Fail every running gang as if one of its workers had failed (another node's
        workers failed): it is stopped, then restarted or given up by the restart policy;
        ``exit_code`` is the job's status if it gives up with no worker of its own failed."""
        self.loop.post(lambda: self._fail_from_outside(reason, exit_code))

    def forward_signal(self, signum: int) -> None:
        """Send ``signum`` to every running worker's process group (and its processes that
        left it), without stopping anything."""
        self.loop.post(lambda: self._forward(signum))

    def wait(self, timeout: float | None) -> int | None:
        if not self.board.wait_done(timeout):
            return None
        if self._crash is not None:
            raise self._crash
        return self._status

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.guardian.watch(self.loop)
            self._initial_start()
            self._check_finished()  # an aborted start may leave nothing that would wake the loop
            while self._status is None:
                self._iterate()
        except BaseException as exc:  # noqa: BLE001 (re-raised by wait())
            # A bug, or an exception from a user callback. Never leave workers behind.
            self._crash = exc
            self._emergency_kill()
        finally:
            self._close()

    def _iterate(self) -> None:
        self.loop.run_once(busy=bool(self._to_reap))
        job_gone = self._reap_trees()
        self._check_finished(job_gone)
        self._publish()

    # -- what workers report (WorkerOwner) -----------------------------------------------
    def emit(self, event: Event) -> None:
        self._publish()  # whoever sees the event sees a status() at least as new
        self.board.add_event(event)
        if self._on_event is not None:
            self._on_event(event)

    def on_spawned(self, worker: Worker) -> None:
        """Tell the record file: the guardian and the sweep find the job's processes by it."""
        if worker.pid is None:
            return
        self.record.add_worker(worker.pid, worker.start_ticks)
        if self.hangs is not None:
            self.hangs.started(worker)

    def on_exit(self, worker: Worker, returncode: int) -> None:
        """The worker's main process was reaped: its tree is checked; its gang may end."""
        self._to_reap.add(worker)
        gang = self._gang_of[worker.name]
        if not gang.can(GangEvent.ENDED) or worker.expected:
            return
        if returncode == 0:  # the worker marked itself EXITED
            if not any(w.alive for w in gang.workers):
                self._gang_ended(gang, Outcome.SUCCEEDED)
            return
        self.on_failed(worker, describe_returncode(returncode))

    def on_failed(self, worker: Worker, reason: str) -> None:
        """A run failed (exit, failed health check, failed start): decide for its gang."""
        gang = self._gang_of[worker.name]
        if not gang.can(GangEvent.ENDED):
            return
        gang.first_failure = worker
        worker.failure_reason = reason
        self._gang_ended(gang, Outcome.FAILED)

    def _fail_from_outside(self, reason: str, exit_code: int) -> None:
        for gang in self.gangs:
            if not gang.can(GangEvent.ENDED):
                continue  # not running: stopping already, waiting to restart, or over
            gang.outside_failure = (reason, exit_code)
            self._gang_ended(gang, Outcome.FAILED, why=reason)

    def _forward(self, signum: int) -> None:
        running = [w for w in self.workers if w.alive and w.pid is not None]
        groups = {w.pid for w in running}
        outside = [p for p in self.scan(running) if p.info.pgid not in groups]
        for worker in running:
            signal_group(worker.pid or 0, signum)
        signal_processes(outside, signum)
        names = tuple(w.name for w in running)
        self.emit(SignalForwarded(self.clock(), signal_name(signum), names))

    def _publish(self) -> None:
        self.board.publish([w.status() for w in self.workers])

    # -- starting ----------------------------------------------------------------------
    def _initial_start(self) -> None:
        if self.settings.max_runtime_s is not None:
            self.loop.call_at(self.clock() + self.settings.max_runtime_s, self._out_of_time)
        try:
            for gang in self.gangs:
                self._start_gang(gang, first=True)
                if self.launch_error is not None:
                    self._abort_start()
                    break
        finally:
            self._publish()  # status() right after start() sees the started workers
            self.board.mark_started()

    def _abort_start(self) -> None:
        """A program could not be started: kill what did start, restart nothing."""
        self._stop_signal = None
        for gang in self.gangs:
            if gang.phase is Phase.RUNNING:
                gang.decision = Decision(Action.DONE, gang.restart, reason="start failed")
                gang.advance(GangEvent.STOP)
                gang.ended_at_s = self.clock()
            self.begin_stop([w for w in gang.workers if w.alive], signal.SIGKILL, 0.0)
            self._maybe_down(gang)  # a gang with nothing running is down now: nothing will reap

    def _start_gang(self, gang: Gang, *, first: bool = False) -> None:
        now = self.clock()
        if not first:
            gang.attempt += 1
            gang.advance(GangEvent.START)
        gang.decision, gang.first_failure, gang.outside_failure = None, None, None
        gang.restart = gang.restart.started(now)
        for worker in gang.workers:
            reason = worker.spawn(gang.attempt, restarts=0 if first else worker.restarts + 1)
            if reason is not None:
                if first and not self._start_retried(worker):
                    self.launch_error = reason
                    return
                self.sink.message(reason)
                self.on_failed(worker, reason)
                return

    def _start_retried(self, worker: Worker) -> bool:
        """A first start that failed is one line and the end of the job (a program that is
        not there or not executable will not become so by waiting), except a program that
        is "Text file busy" (ETXTBSY: a build or copy still has it open for writing): under a
        restart policy that is a failed attempt, started again after the backoff."""
        return worker.start_busy and self.policy.mode is not RestartMode.NO

    # -- a gang ending, going down, and starting again -------------------------------
    def _gang_ended(self, gang: Gang, outcome: Outcome, why: str = "") -> None:
        now = self.clock()
        gang.decision = decide(gang.restart, outcome, self.policy, now)
        if why:  # the decision's reason (in Restarting, GaveUp) says what failed it
            gang.decision = replace(gang.decision, reason=f"{why}; {gang.decision.reason}")
        gang.restart = gang.decision.state
        gang.advance(GangEvent.ENDED)
        gang.ended_at_s = now
        self.begin_stop([w for w in gang.workers if w.alive], signal.SIGTERM, self.grace_s)
        self._maybe_down(gang)

    def _maybe_down(self, gang: Gang) -> None:
        if gang.is_down:
            self._gang_down(gang)

    def _gang_down(self, gang: Gang) -> None:
        decision = gang.decision or Decision(Action.DONE, gang.restart)
        gang.advance(_DOWN_EVENT[decision.action])
        if gang.phase is Phase.BACKOFF:
            self._set_states(gang, WorkerState.BACKOFF)
            count, delay_s = decision.state.total_restarts, decision.delay_s
            self.emit(Restarting(self.clock(), gang.names, delay_s, count, decision.reason))
            when = max(self.clock(), gang.ended_at_s + decision.delay_s)
            self.loop.call_at(when, lambda: self._after_backoff(gang))
        elif gang.phase is Phase.FAILED:
            self._gave_up(gang, decision.reason)
        else:
            self._set_states(gang, WorkerState.EXITED)

    def _gave_up(self, gang: Gang, reason: str) -> None:
        self._set_states(gang, WorkerState.FAILED)
        self.emit(GaveUp(self.clock(), gang.names, gang.exit_status(), reason))

    @staticmethod
    def _set_states(gang: Gang, state: WorkerState) -> None:
        for worker in gang.workers:
            worker.gang_is(state)

    def _after_backoff(self, gang: Gang) -> None:
        if gang.phase is not Phase.BACKOFF:
            return  # a stop came first (see gang.py)
        if self._settle is None:
            self._start_gang(gang)
            return
        gang.advance(GangEvent.SETTLE)
        settle, names = self._settle, gang.names
        self.loop.submit(lambda: settle(names), lambda f: self._settled(gang, f))

    def _settled(self, gang: Gang, future: Future[None]) -> None:
        refusal = future.exception()
        if not isinstance(refusal, LaunchError):
            future.result()  # any other exception is a bug: let the loop's handler see it
        if gang.phase is not Phase.SETTLING:  # a stop came first
            return
        if isinstance(refusal, LaunchError):
            if gang.first_failure is None and gang.outside_failure is None:
                gang.outside_failure = (str(refusal), refusal.exit_code)
            gang.advance(GangEvent.REFUSED)
            self._gave_up(gang, str(refusal))
            return
        self._start_gang(gang)

    # -- stopping ------------------------------------------------------------------------
    def _out_of_time(self) -> None:
        if self._status is not None or self._stop_requests:
            return  # over, or being stopped already
        self._timed_out = True
        self.emit(TimedOut(self.clock(), self.settings.max_runtime_s or 0.0))
        self._stop_all(signal.SIGTERM, None, "max_runtime")

    def _stop_all(self, signum: int, grace_s: float | None, cause: str = "signal") -> None:
        self._stop_requests += 1
        if self._stop_requests == 1:
            self._stopped_by_signal = cause == "signal"
        now = self.clock()
        kill = self._stop_requests > 1
        if self._status is None:
            self.emit(Stopping(now, signal_name(signum), kill, cause))
        if kill:  # a second Ctrl-C: kill everything at once
            for worker in self.workers:
                worker.kill_at_s = now
            self.kill_overdue()
            return
        self._stop_signal = signum
        grace = self.grace_s if grace_s is None else grace_s
        for gang in self.gangs:
            if not gang.can(GangEvent.STOP):
                continue  # done or failed already
            gave_up = gang.decision is not None and gang.decision.action is Action.GIVE_UP
            if not gave_up:
                gang.decision = decide(gang.restart, Outcome.STOPPED, self.policy, now)
            if gang.phase is not Phase.STOPPING:
                gang.ended_at_s = now
            gang.advance(GangEvent.STOP)  # a pending backoff or settle callback then does nothing
            self.begin_stop([w for w in gang.workers if w.alive and not w.expected], signum, grace)
            self._maybe_down(gang)

    def begin_stop(self, workers: Sequence[Worker], signum: int, grace_s: float) -> None:
        """Signal each worker's group and its processes outside it; KILL after ``grace_s``."""
        if not workers:
            return
        deadline = self.clock() + grace_s
        groups = {w.pid for w in workers if w.alive}
        outside = [p for p in self.scan(workers) if p.info.pgid not in groups]
        for worker in workers:
            worker.begin_stop(signum, deadline)
        for sig in with_cont(signum):  # a stopped process must be continued to act on it
            signal_processes(outside, sig)
        self.loop.call_at(deadline, self.kill_overdue)

    def kill_overdue(self) -> None:
        now = self.clock()
        overdue = [w for w in self.workers if w.kill_at_s is not None and w.kill_at_s <= now]
        overdue = [w for w in overdue if not w.down]
        for worker in overdue:
            worker.kill_group()
        signal_processes(self.scan(overdue), signal.SIGKILL)
        self._to_reap.update(w for w in overdue if not w.alive)

    def scan(self, workers: Sequence[Worker]) -> list[JobProcess]:
        """Live processes that belong to ``workers`` (by session id or by marker)."""
        return self._owned(workers, self._find(workers))

    def _find(self, workers: Sequence[Worker]) -> list[JobProcess]:
        """Live processes of the job: in ``workers``' sessions, or carrying the job marker."""
        if not workers:
            return []
        return self._find_job({w.pid: w.start_ticks for w in workers if w.pid is not None})

    def _find_job(self, sessions: Mapping[int, int]) -> list[JobProcess]:
        cgroup = self.cgroup.path if self.cgroup is not None else None
        return find_job(
            self.job_id, sessions, since_ticks=self.since_ticks, exclude=self._ours, cgroup=cgroup
        )

    @property
    def _ours(self) -> frozenset[int]:
        """The supervisor's and the guardian's pids: never processes of the job to kill."""
        return frozenset({os.getpid(), self.guardian.pid})

    def _owned(self, workers: Sequence[Worker], found: list[JobProcess]) -> list[JobProcess]:
        sessions = {w.pid for w in workers}
        names = {w.name for w in workers}
        return [p for p in found if p.info.sid in sessions or p.worker in names]

    def _reap_trees(self) -> bool:
        """Workers whose main process ended: are their trees gone too? One scan per batch.

        True when that scan found no process of the job at all (nor any with its marker).
        """
        batch = [w for w in self._to_reap if not w.alive]
        self._to_reap.clear()
        if not batch:
            return False
        found = self._find(batch)
        left: dict[str, list[JobProcess]] = {}
        by_sid = {w.pid: w.name for w in batch}
        for process in self._owned(batch, found):
            name = by_sid.get(process.info.sid) or process.worker or ""
            left.setdefault(name, []).append(process)
        dying = [w for w in batch if w.name in left]
        for worker in batch:
            if worker.name not in left:
                worker.tree_gone()
                self._maybe_down(self._gang_of[worker.name])
        for worker in dying:
            deadline_s = worker.signal_leftovers(left[worker.name], self.grace_s)
            if deadline_s is not None:
                self.loop.call_at(deadline_s, self.kill_overdue)
        if dying:
            self.loop.call_at(self.clock() + RECHECK_S, lambda: self._to_reap.update(dying))
        return not found

    # -- finishing -----------------------------------------------------------------------
    def _check_finished(self, job_gone: bool = False) -> None:
        """``job_gone``: a scan of this iteration, after the last spawn, found no process of
        the job at all, so a second scan is not needed: without a live process of the job,
        none can appear."""
        if self._status is not None or not self.board.started:
            return
        if any(g.phase not in FINAL_PHASES for g in self.gangs):
            return
        if not job_gone:
            strays = self._find_job({})
            if strays:  # a marked process no worker owns any more (changed its marker?)
                signal_processes(strays, signal.SIGKILL)
                self.loop.call_at(self.clock() + RECHECK_S, lambda: None)  # look again then
                return
        self._status, reason = self._final_status()
        self.emit(Stopped(self.clock(), self._status, reason))

    def _final_status(self) -> tuple[int, str]:
        if self.launch_error is not None:
            codes = [w.exit_code for w in self.workers if w.failure_reason == self.launch_error]
            code = next((c for c in codes if c), START_FAILED_STATUS)
            return code, self.launch_error
        failed = [g for g in self.gangs if g.phase is Phase.FAILED]
        if failed:
            gang = min(failed, key=lambda g: g.ended_at_s)
            first, outside = gang.first_failure, gang.outside_failure
            if first is None and outside is not None:
                return gang.exit_status(), outside[0]
            return gang.exit_status(), f"worker {first.name if first else '?'} failed"
        if self._timed_out:
            return TIMED_OUT_STATUS, f"ran for --max-runtime {self.settings.max_runtime_s:g} s"
        if self._stop_signal is not None and self._stopped_by_signal:
            return 128 + self._stop_signal, f"stopped by {signal_name(self._stop_signal)}"
        if self._stop_signal is not None:
            return 0, "stopped on request"
        return 0, "finished"

    def release_leases(self) -> bool:
        """Unlock the job's device leases (call only once no process of the job is left).

        flock locks belong to the open file description that the supervisor, the workers
        (and what they started) and the guardian share (flock(2)), so ``LOCK_UN`` frees the
        devices for all of them at once, without waiting for the guardian (the last holder) to
        exit. But a process the job started may have left it (root may leave the job's
        cgroup; without one, ``setsid`` and a cleared environment are enough) and still hold
        the lease descriptor it inherited, and with it the device: such a lease is not
        unlocked, so it ends when the last holder exits, and the survivor is named. False: a
        lease stays locked (a survivor, or a descriptor that took no unlock), so the guardian
        must be waited for after all.
        """
        survivors = self._lease_survivors()
        unlocked = True
        for fd in self._lease_fds:
            if _inode(fd) in survivors:
                unlocked = False
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                unlocked = False
        return unlocked

    def _lease_survivors(self) -> dict[tuple[int, int], list[int]]:
        """Lease file (inode) -> the processes outside the supervisor that still hold it."""
        inodes = {_inode(fd): fd for fd in self._lease_fds}
        held: dict[tuple[int, int], list[int]] = {}
        sharers = flock_sharers(self._lease_fds, exclude=self._ours, since_ticks=self.since_ticks)
        for pid, files in sorted(sharers.items()):
            for inode in files:
                held.setdefault(inode, []).append(pid)
        for inode, pids in held.items():
            first = pids[0]
            others, verb, they = (
                (f" and {len(pids) - 1} more", "hold", "they exit")
                if len(pids) > 1
                else ("", "holds", "that process exits")
            )
            self.sink.message(
                f"warning: pid {first} ({command_line(first, 60)}){others} left the job but "
                f"still {verb} the lease of {_lease_name(inodes[inode])}: it stays leased "
                f"until {they}"
            )
        return held

    def _emergency_kill(self) -> None:
        for worker in self.workers:
            if worker.alive:
                worker.kill_group()
        if self.cgroup is not None:
            self.cgroup.kill()
        if self.guardian.handle is not None:
            return  # closing its pipe without "done" makes it kill whatever is left
        signal_processes(self.scan(self.workers), signal.SIGKILL)

    def _close(self) -> None:
        for worker in self.workers:
            worker.close()
        # Finished (not crashed) means _check_finished saw every process of the job gone.
        finished = self._crash is None and self._status is not None
        unlocked = self._release and finished and self.release_leases()
        # Leases not unlocked here: wait (bounded) for the guardian, which holds them, so
        # that the caller's own release frees the devices at once.
        wait = bool(self._lease_fds) and not unlocked
        self.guardian.close(done=self._crash is None, wait=wait)
        for fd in self._lease_fds:
            os.close(fd)
        if self.cgroup is not None and finished:
            self.cgroup.remove()  # empty: _check_finished saw no member left
        if self._crash is None:
            self.record.remove()
        else:
            self.record.close()
        self.loop.close()
        self.sink.close()
        if self._remove_run_dir:
            shutil.rmtree(self._run_dir, ignore_errors=True)  # private: ours to remove
        self._publish()
        self.board.mark_done()


def _inode(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _lease_name(fd: int) -> str:
    """The unit key of a lease descriptor (``0000:17:00.0``), from its lock file's name."""
    try:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return "a device"
    if name.startswith(UNIT_PREFIX) and name.endswith(LOCK_SUFFIX):
        return key_of_lock_file(name) or name
    return name
