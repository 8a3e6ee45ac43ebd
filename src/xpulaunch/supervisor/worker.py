"""One supervised worker as the engine's loop thread sees it: process, pipes, health checks.

A :class:`Worker` owns its OS process, its output pipes and its health checks, and reports
facts to its owner through :class:`WorkerOwner` (it started, it exited with this status, it
failed its health check, an event for the user). It does not know its gang nor the restart
policy: what a fact means for the job is the owner's (:class:`xpulaunch.supervisor.engine.Engine`)
decision. What it needs besides its owner is injected: the loop (selector, timers, helper
threads, clock), the log sink and the job id.

Only the loop thread touches a worker. ``alive`` means its main process has not been reaped
yet (so its pid, process-group id and session id cannot be reused and ``killpg`` on it is
safe); ``down`` means the main process *and* everything it left behind are gone, which is what
a restart waits for.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import signal
import subprocess
import threading
from typing import TYPE_CHECKING, Protocol

from xpulaunch.errors import XpulaunchError
from xpulaunch.events import Exited, Ready, Started, Unhealthy, WorkerState, WorkerStatus
from xpulaunch.joblog.logs import KEEP_ATTEMPTS, LineBuffer
from xpulaunch.processes.procfs import process_info
from xpulaunch.processes.signals import (
    exit_status,
    signal_group,
    signal_name,
    signal_processes,
    with_cont,
)
from xpulaunch.processes.spawn import (
    open_pidfd,
    out_of_files_message,
    script_interpreter,
    spawn,
)
from xpulaunch.supervisor.spec import heartbeat_path, start_env

if TYPE_CHECKING:
    from collections.abc import Sequence
    from concurrent.futures import Future
    from pathlib import Path
    from typing import IO

    from xpulaunch.events import Event
    from xpulaunch.joblog.logs import LogSink
    from xpulaunch.processes.cgroup import JobCgroup
    from xpulaunch.processes.procfs import JobProcess
    from xpulaunch.root_cause import RootCause
    from xpulaunch.supervisor.health import HealthCheckRun
    from xpulaunch.supervisor.loop import Loop
    from xpulaunch.supervisor.spec import WorkerSpec

_READ_BYTES = 64 * 1024
START_FAILED_STATUS = 127  # what a shell reports for a command it cannot find
CANNOT_EXECUTE_STATUS = 126  # ... and for one it found but cannot run (POSIX sh, 2.8.2)


class WorkerOwner(Protocol):
    """What a worker tells its owner. Every call comes from the loop thread."""

    def emit(self, event: Event) -> None:
        """An event for the user (Started, Ready, Exited, Unhealthy)."""

    def on_spawned(self, worker: Worker) -> None:
        """The worker's process runs: ``worker.pid`` and ``worker.start_ticks`` are set."""

    def on_exit(self, worker: Worker, returncode: int) -> None:
        """The worker's main process was reaped (``returncode`` as Popen reports it)."""

    def on_failed(self, worker: Worker, reason: str) -> None:
        """The worker failed while it may still run (a failed health check)."""


def describe_start_error(argv0: str, exc: BaseException, cwd: str | None = None) -> str:
    if isinstance(exc, FileNotFoundError):
        missing = exc.filename or argv0
        if os.sep in missing and os.path.isfile(os.path.join(cwd or "", missing)):
            return _missing_interpreter(missing, cwd)
        return f"{missing}: no such file or directory"
    if isinstance(exc, PermissionError):
        return f"{exc.filename or argv0}: permission denied (not executable?)"
    if isinstance(exc, OSError):
        return f"{argv0}: {exc.strerror or exc}"
    return f"{argv0}: {exc}"


def _missing_interpreter(script: str, cwd: str | None) -> str:
    """The script is there, so what exec did not find is the interpreter of its ``#!``
    line (the shell says "bad interpreter"), most often one with a ``\\r`` at its end."""
    interpreter = script_interpreter(os.path.join(cwd or "", script))
    if interpreter is None:
        return f"{script}: its interpreter was not found"
    why = f"{script}: its interpreter {interpreter!r} (the #! line) was not found"
    if interpreter.endswith("\r"):
        return f"{why}: the script has Windows line endings (CRLF); convert it with dos2unix"
    return why


class Worker:
    def __init__(
        self,
        spec: WorkerSpec,
        owner: WorkerOwner,
        *,
        loop: Loop,
        sink: LogSink,
        job_id: str,
        run_dir: Path | None = None,
        heartbeat: bool = False,
        cgroup: JobCgroup | None = None,
    ) -> None:
        self.name, self.spec, self._cgroup = spec.name, spec, cgroup
        self._owner, self._loop, self._sink, self._job_id = owner, loop, sink, job_id
        self._run_dir = run_dir  # TORCHELASTIC_ERROR_FILE (and heartbeat) go under it
        self._heartbeat = heartbeat
        self._error_file: Path | None = None
        self.heartbeat_file: Path | None = None
        self.started_at_s: float | None = None
        self.last_output_s = 0.0  # when it last wrote a line (or started): hang detection
        self.state = WorkerState.PENDING
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        self.start_ticks = 0
        self.attempt = 0
        self.restarts = 0
        self.exit_code: int | None = None
        self.alive = False
        self.down = True
        self.expected = False  # we asked it to stop
        self.kill_at_s: float | None = None
        self.failure_reason = ""
        self.failed_status: int | None = None  # the job's status if this failure ends it
        self.start_busy = False  # the last start failed with ETXTBSY (see Engine)
        self.run_id = 0  # bumped per start, so late callbacks of an old run are ignored
        self._pidfd: int | None = None
        self._streams: dict[bool, tuple[IO[bytes], LineBuffer]] = {}
        self._health: HealthCheckRun | None = None
        self._first_line = 0  # the sink's line number where this run's output starts

    @property
    def job_status(self) -> int | None:
        """The job's exit status when this worker's failure ends it: its exit code, unless
        the supervisor failed it for a reason of its own (a hang)."""
        return self.failed_status if self.failed_status is not None else self.exit_code

    def status(self) -> WorkerStatus:
        ready = self.alive and self.state is WorkerState.READY
        pid = self.pid if self.alive else None
        return WorkerStatus(
            self.name, self.state, pid, self.restarts, self.attempt, self.exit_code, ready
        )

    # -- starting ----------------------------------------------------------------------
    def spawn(self, attempt: int, *, restarts: int) -> str | None:
        """Start attempt ``attempt``; returns why it could not be started, else None."""
        self.attempt, self.restarts = attempt, restarts
        self.start_busy = False
        # The last run's pipes may still be open: a process that escaped the job (setsid and
        # an empty environment, without a job cgroup) holds their write ends. Read what they
        # hold and let go of them: the new run's pipes take their place in _streams, and
        # the old ones left registered would be read by nobody, and spin the loop once
        # readable.
        self._close_streams()
        try:
            spec = self.spec.prepare(attempt) if self.spec.prepare else self.spec
        except (XpulaunchError, OSError) as exc:
            return self._start_failed(f"cannot prepare worker {self.name}: {exc}")
        self._prune_run_dir(attempt)
        error_file = self._fresh_error_file(attempt)
        self.heartbeat_file = None
        if self._heartbeat and self._run_dir is not None:
            self.heartbeat_file = heartbeat_path(self._run_dir, attempt, self.name)
            with contextlib.suppress(OSError):  # then only its start counts as a beat
                self.heartbeat_file.touch()  # a fresh mtime: the run has just begun
        env = start_env(
            spec.env,
            job_id=self._job_id,
            worker=self.name,
            attempt=attempt,
            error_file=str(error_file or ""),
            heartbeat_file=str(self.heartbeat_file or ""),
        )
        self._sink.open_attempt(self.name, attempt)
        self._first_line = self._sink.mark(self.name)
        cgroup_fd = self._cgroup_fd()
        try:
            proc = spawn(spec.argv, env, cwd=spec.cwd, pass_fds=spec.pass_fds, cgroup_fd=cgroup_fd)
        except (OSError, subprocess.SubprocessError) as exc:
            self.start_busy = isinstance(exc, OSError) and exc.errno == errno.ETXTBSY
            ours = out_of_files_message(exc) if isinstance(exc, OSError) else None
            if ours is not None:  # our limit, not the program's fault: not 126 or 127
                return self._start_failed(f"cannot start worker {self.name}: {ours}", 1)
            why = describe_start_error(spec.argv[0], exc, spec.cwd)
            status = START_FAILED_STATUS
            if not isinstance(exc, FileNotFoundError):
                status = CANNOT_EXECUTE_STATUS
            return self._start_failed(f"cannot start worker {self.name}: {why}", status)
        finally:
            if cgroup_fd is not None:
                os.close(cgroup_fd)
        self._started(proc, spec, attempt)
        return None

    def _prune_run_dir(self, attempt: int) -> None:
        """Keep ``attempt_0`` and the last :data:`KEEP_ATTEMPTS` attempts of this worker's
        files in the run directory, as its logs are kept: a crash loop must not grow it
        without bound. The older attempt's error file and heartbeat go, and its directory
        once no worker has anything left there (the log sink removes the log next)."""
        old = attempt - KEEP_ATTEMPTS
        if old < 1 or self._run_dir is None:
            return
        error_file = self._sink.error_file(self._run_dir, self.name, old)
        for path in (error_file, heartbeat_path(self._run_dir, old, self.name)):
            with contextlib.suppress(OSError):  # never written, or removed already
                path.unlink()
        with contextlib.suppress(OSError):  # other workers' files (or logs) are still there
            (self._run_dir / f"attempt_{old}").rmdir()

    def _fresh_error_file(self, attempt: int) -> Path | None:
        """This attempt's error file path, with no file left there by an earlier run."""
        if self._run_dir is None:
            return None
        path = self._sink.error_file(self._run_dir, self.name, attempt)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
        except OSError:
            return None  # no root cause from a file then; the stderr tail still serves
        self._error_file = path
        return path

    def root_cause(self, tail: Sequence[str]) -> RootCause | None:
        """The exception this run died of: torch's error file first, else its stderr."""
        from xpulaunch.root_cause import from_error_file, from_stderr  # only on failure

        if self._error_file is not None:
            try:
                found = from_error_file(self._error_file.read_text(errors="replace"))
            except OSError:
                found = None
            if found is not None:
                return found
        return from_stderr(tail)

    def _cgroup_fd(self) -> int | None:
        """The worker's leaf ``cgroup.procs`` to join; None without a job cgroup (or when the
        leaf cannot be made: the worker then runs in the supervisor's cgroup)."""
        if self._cgroup is None:
            return None
        try:
            return self._cgroup.open_procs(self.name)
        except OSError:
            return None

    def _start_failed(self, reason: str, status: int = START_FAILED_STATUS) -> str:
        self.exit_code, self.failure_reason = status, reason
        self.state = WorkerState.STOPPING  # nothing runs; the gang decides what comes next
        return reason

    def _started(self, proc: subprocess.Popen[bytes], spec: WorkerSpec, attempt: int) -> None:
        now = self._loop.clock()
        self.proc, self.pid = proc, proc.pid
        info = process_info(proc.pid)  # not reaped yet, so it is there (maybe as a zombie)
        self.start_ticks = info.start_ticks if info else 0
        self.run_id += 1
        self.alive, self.down, self.expected, self.kill_at_s = True, False, False, None
        self.exit_code, self.failure_reason, self.failed_status = None, "", None
        self.started_at_s = self.last_output_s = now
        self._owner.on_spawned(self)
        self._watch(proc)
        self._health = _health_checks(spec, now)
        ready = self._health is None or self._health.ready
        self.state = WorkerState.READY if ready else WorkerState.STARTING
        self._owner.emit(Started(now, self.name, proc.pid, attempt))
        if ready:
            self._owner.emit(Ready(now, self.name))
        if self._health is not None and self._health.check is not None:
            run_id = self.run_id
            self._loop.call_at(now, lambda: self._health_tick(run_id))

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        selector = self._loop.selector
        for is_err, stream in ((False, proc.stdout), (True, proc.stderr)):
            if stream is not None:
                self._streams[is_err] = (stream, LineBuffer())
                selector.register(stream, selectors.EVENT_READ, lambda e=is_err: self._read(e))
        run_id = self.run_id
        self._pidfd = open_pidfd(proc.pid)
        if self._pidfd is not None:
            selector.register(self._pidfd, selectors.EVENT_READ, lambda: self._on_exit(run_id))
        else:  # kernel < 5.3: one blocked waiter thread per worker instead of a pidfd
            threading.Thread(target=self._wait_exit, args=(proc.pid, run_id), daemon=True).start()

    def _wait_exit(self, pid: int, run_id: int) -> None:
        with contextlib.suppress(ChildProcessError):  # reaped already: the post is a no-op
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        self._loop.post(lambda: self._on_exit(run_id))

    # -- output ----------------------------------------------------------------------------
    def _read(self, is_err: bool) -> bool:
        """Read one chunk of a stream; False when nothing more will come now."""
        if is_err not in self._streams:  # closed earlier in the same batch of ready fds
            return False
        stream, buffer = self._streams[is_err]
        try:
            data = os.read(stream.fileno(), _READ_BYTES)
        except BlockingIOError:
            return False
        self.last_output_s = self._loop.clock()
        if not data:
            self._sink.write(self.name, is_err, buffer.flush())
            self._loop.selector.unregister(stream)
            stream.close()
            del self._streams[is_err]
            return False
        self._sink.write(self.name, is_err, buffer.feed(data))
        return True

    def _close_streams(self) -> None:
        """Read what the pipes hold now, then close them."""
        self.drain()
        for stream, _ in list(self._streams.values()):
            self._loop.selector.unregister(stream)
            stream.close()
        self._streams.clear()

    def drain(self) -> None:
        """Read everything the pipes hold now (before reporting an exit or closing)."""
        for is_err in (False, True):
            while is_err in self._streams and self._read(is_err):
                pass

    # -- exit ------------------------------------------------------------------------------
    def _on_exit(self, run_id: int) -> None:
        if run_id != self.run_id or not self.alive or self.proc is None:
            return
        if self._pidfd is not None:
            self._loop.selector.unregister(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self.drain()
        returncode = self.proc.wait()
        self.alive, self.exit_code = False, exit_status(returncode)
        # Until its whole tree is gone and the gang decided, a failed or stopped worker is
        # still going down; a clean exit in a running gang is simply finished.
        finished = returncode == 0 and not self.expected
        self.state = WorkerState.EXITED if finished else WorkerState.STOPPING
        sig = signal_name(-returncode) if returncode < 0 else None
        tail = self._sink.tail(self.name, 20, stderr_only=True, since=self._first_line)
        failed = returncode != 0 and not self.expected
        cause = self.root_cause(tail) if failed else None
        event = Exited(
            self._loop.clock(),
            self.name,
            self.proc.pid,
            self.exit_code,
            sig,
            self.expected,
            tuple(tail),
            cause,
        )
        self._owner.emit(event)
        self._owner.on_exit(self, returncode)

    def tree_gone(self) -> None:
        self.down, self.kill_at_s = True, None

    def gang_is(self, state: WorkerState) -> None:
        """The gang's decision once every worker is down: backing off before a restart,
        failed for good, or finished. Only this class writes ``state``."""
        self.state = state

    # -- stopping --------------------------------------------------------------------------
    def begin_stop(self, signum: int, deadline_s: float) -> None:
        self.expected = True
        self.state = WorkerState.STOPPING
        if self.kill_at_s is None or deadline_s < self.kill_at_s:
            self.kill_at_s = deadline_s
        if self.alive and self.pid is not None:
            for sig in with_cont(signum):
                signal_group(self.pid, sig)

    def kill_group(self) -> None:
        # Only while the main process is unreaped: then the group id cannot be reused.
        if self.alive and self.pid is not None:
            signal_group(self.pid, signal.SIGKILL)

    def signal_leftovers(self, processes: list[JobProcess], grace_s: float) -> float | None:
        """The main process is gone but these of its processes are not: TERM them with a
        new deadline (returned: the owner KILLs at it), or KILL them once it passed."""
        now = self._loop.clock()
        if self.kill_at_s is None:  # it ended on its own: ask the rest politely first
            self.kill_at_s = now + grace_s
            for sig in with_cont(signal.SIGTERM):
                signal_processes(processes, sig)
            return self.kill_at_s
        if now >= self.kill_at_s:
            signal_processes(processes, signal.SIGKILL)
        return None

    def close(self) -> None:
        """The loop is ending: read what is left, release fds, reap (after a kill)."""
        self._close_streams()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if self.alive and self.proc is not None:
            self.proc.wait()  # only after an emergency SIGKILL of the group
            self.alive = False

    # -- health checks ---------------------------------------------------------------------
    def _health_tick(self, run_id: int) -> None:
        from xpulaunch.supervisor.health import Verdict, run_check

        health = self._health
        if run_id != self.run_id or not self.alive or health is None:
            return
        probe = health.check
        verdict = health.tick(self._loop.clock())
        if verdict is Verdict.SUBMIT and probe is not None:
            check = probe.check
            self._loop.submit(lambda: run_check(check), lambda f: self._health_done(run_id, f))
        elif verdict is Verdict.UNHEALTHY:
            self._unhealthy(health.detail)
            return
        if probe is not None:
            next_s = self._loop.clock() + probe.interval_s
            self._loop.call_at(next_s, lambda: self._health_tick(run_id))

    def _health_done(self, run_id: int, future: Future[tuple[bool, str]]) -> None:
        from xpulaunch.supervisor.health import Verdict

        health = self._health
        if run_id != self.run_id or not self.alive or health is None:
            return
        ok, detail = future.result()
        verdict = health.result(ok, detail)
        if verdict is Verdict.READY:
            self.state = WorkerState.READY
            self._owner.emit(Ready(self._loop.clock(), self.name))
        elif verdict is Verdict.UNHEALTHY:
            self._unhealthy(health.detail)

    def _unhealthy(self, reason: str) -> None:
        self._health = None
        self._owner.emit(Unhealthy(self._loop.clock(), self.name, reason))
        self._owner.on_failed(self, reason)


def _health_checks(spec: WorkerSpec, now_s: float) -> HealthCheckRun | None:
    """The run's health checks; None for a worker that has none (only servers have them, so
    their module is imported here)."""
    if spec.readiness is None and spec.liveness is None:
        return None
    from xpulaunch.supervisor.health import HealthCheckRun

    return HealthCheckRun(spec.readiness, spec.liveness, now_s)
