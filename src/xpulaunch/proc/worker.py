"""One supervised worker as the engine's loop thread sees it: process, pipes, health checks.

Only the loop thread touches a :class:`Worker`. ``alive`` means its main process has not been
reaped yet (so its pid, process-group id and session id cannot be reused and ``killpg`` on
it is safe); ``down`` means the main process *and* everything it left behind are gone, which
is what a restart waits for.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
from typing import TYPE_CHECKING

from xpulaunch.errors import XpulaunchError
from xpulaunch.model import RESTART_COUNT_VAR
from xpulaunch.proc.events import Exited, Ready, Started, Unhealthy, WorkerState, WorkerStatus
from xpulaunch.proc.guardian import JOB_ID_VAR, WORKER_VAR, Member, read_stat
from xpulaunch.proc.logs import LineBuffer
from xpulaunch.proc.probes import ProbeRun, Verdict, run_check
from xpulaunch.proc.spawn import open_pidfd, spawn
from xpulaunch.proc.spec import WorkerSpec
from xpulaunch.proc.tree import exit_status, signal_group, signal_members, signal_name

if TYPE_CHECKING:
    from concurrent.futures import Future
    from typing import IO

    from xpulaunch.proc.engine import Engine, Gang

_READ_BYTES = 64 * 1024
START_FAILED_STATUS = 127  # what a shell reports for a command it cannot run


def with_cont(signum: int) -> tuple[int, ...]:
    """The signals that stop a worker: ``signum``, then SIGCONT (unless it is SIGKILL).

    A stopped process (SIGSTOP, a debugger's stop) leaves a caught SIGTERM pending until it
    is continued (llama-server catches it), so without SIGCONT a worker that failed its
    liveness check because it was stopped would only go at the SIGKILL deadline. systemd
    does the same: right after the stop signal it always sends SIGCONT, so that suspended
    tasks can terminate cleanly (systemd.kill(5), KillSignal=). The stop signal goes first
    so that it is already pending when the process resumes.
    """
    return (signum,) if signum in (signal.SIGKILL, signal.SIGCONT) else (signum, signal.SIGCONT)


def describe_start_error(argv0: str, exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        missing = exc.filename or argv0
        return f"{missing}: no such file or directory"
    if isinstance(exc, PermissionError):
        return f"{exc.filename or argv0}: permission denied (not executable?)"
    if isinstance(exc, OSError):
        return f"{argv0}: {exc.strerror or exc}"
    return f"{argv0}: {exc}"


class Worker:
    def __init__(self, spec: WorkerSpec, engine: Engine) -> None:
        self.name, self.spec, self.engine = spec.name, spec, engine
        self.gang: Gang  # set by the engine right after construction
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
        self.token = 0  # bumped per start, so late callbacks of an old run are ignored
        self._pidfd: int | None = None
        self._streams: dict[bool, tuple[IO[bytes], LineBuffer]] = {}
        self._probe: ProbeRun | None = None
        self._first_line = 0  # the sink's line number where this run's output starts

    def status(self) -> WorkerStatus:
        ready = self.alive and self.state is WorkerState.READY
        pid = self.pid if self.alive else None
        return WorkerStatus(
            self.name, self.state, pid, self.restarts, self.attempt, self.exit_code, ready
        )

    # -- starting ----------------------------------------------------------------------
    def spawn(self, attempt: int, *, restarts: int) -> str | None:
        """Start attempt ``attempt``; returns why it could not be started, else None."""
        engine = self.engine
        self.attempt, self.restarts = attempt, restarts
        try:
            spec = self.spec.prepare(attempt) if self.spec.prepare else self.spec
        except (XpulaunchError, OSError) as exc:
            return self._start_failed(f"cannot prepare worker {self.name}: {exc}")
        env = {
            **spec.env,
            JOB_ID_VAR: engine.job_id,
            WORKER_VAR: self.name,
            RESTART_COUNT_VAR: str(attempt),
        }
        engine.sink.open_attempt(self.name, attempt)
        self._first_line = engine.sink.mark(self.name)
        try:
            proc = spawn(spec.argv, env, cwd=spec.cwd, pass_fds=spec.pass_fds)
        except (OSError, subprocess.SubprocessError) as exc:
            why = describe_start_error(spec.argv[0], exc)
            return self._start_failed(f"cannot start worker {self.name}: {why}")
        self._started(proc, spec, attempt)
        return None

    def _start_failed(self, reason: str) -> str:
        self.exit_code, self.failure_reason = START_FAILED_STATUS, reason
        self.state = WorkerState.STOPPING  # nothing runs; the gang decides what comes next
        return reason

    def _started(self, proc: subprocess.Popen[bytes], spec: WorkerSpec, attempt: int) -> None:
        engine, now = self.engine, self.engine.clock()
        info = read_stat(proc.pid)  # not reaped yet, so it is there (maybe as a zombie)
        self.proc, self.pid = proc, proc.pid
        self.start_ticks = info.start_ticks if info else 0
        self.token += 1
        self.alive, self.down, self.expected, self.kill_at_s = True, False, False, None
        self.exit_code, self.failure_reason = None, ""
        if engine.guardian is not None:
            engine.guardian.send(f"s {proc.pid} {self.start_ticks}")
        engine.record.add_worker(proc.pid, self.start_ticks)
        self._watch(proc)
        self._probe = ProbeRun(spec.readiness, spec.liveness, now)
        self.state = WorkerState.READY if self._probe.ready else WorkerState.STARTING
        engine.emit(Started(now, self.name, proc.pid, attempt))
        if self._probe.ready:
            engine.emit(Ready(now, self.name))
        if self._probe.probe is not None:
            token = self.token
            engine.loop.call_at(now, lambda: self._probe_tick(token))

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        selector = self.engine.loop.selector
        for is_err, stream in ((False, proc.stdout), (True, proc.stderr)):
            if stream is not None:
                self._streams[is_err] = (stream, LineBuffer())
                selector.register(stream, selectors.EVENT_READ, lambda e=is_err: self._read(e))
        token = self.token
        self._pidfd = open_pidfd(proc.pid)
        if self._pidfd is not None:
            selector.register(self._pidfd, selectors.EVENT_READ, lambda: self._on_exit(token))
        else:  # kernel < 5.3: one blocked waiter thread per worker instead of a pidfd
            threading.Thread(target=self._wait_exit, args=(proc.pid, token), daemon=True).start()

    def _wait_exit(self, pid: int, token: int) -> None:
        with contextlib.suppress(ChildProcessError):  # reaped already: the post is a no-op
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        self.engine.loop.post(lambda: self._on_exit(token))

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
        if not data:
            self.engine.sink.write(self.name, is_err, buffer.flush())
            self.engine.loop.selector.unregister(stream)
            stream.close()
            del self._streams[is_err]
            return False
        self.engine.sink.write(self.name, is_err, buffer.feed(data))
        return True

    def drain(self) -> None:
        """Read everything the pipes hold now (before reporting an exit or closing)."""
        for is_err in (False, True):
            while is_err in self._streams and self._read(is_err):
                pass

    # -- exit ------------------------------------------------------------------------------
    def _on_exit(self, token: int) -> None:
        if token != self.token or not self.alive or self.proc is None:
            return
        if self._pidfd is not None:
            self.engine.loop.selector.unregister(self._pidfd)
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
        tail = self.engine.sink.tail(self.name, 20, stderr_only=True, since=self._first_line)
        event = Exited(self.engine.clock(), self.name, self.proc.pid, self.exit_code, sig,
                       self.expected, tuple(tail))  # fmt: skip
        self.engine.emit(event)
        self.engine.member_exited(self, returncode)

    def tree_gone(self) -> None:
        self.down, self.kill_at_s = True, None

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

    def signal_leftovers(self, members: list[Member]) -> None:
        """The main process is gone but these of its processes are not."""
        now = self.engine.clock()
        if self.kill_at_s is None:  # it ended on its own: ask the rest politely first
            self.kill_at_s = now + self.engine.grace_s
            for sig in with_cont(signal.SIGTERM):
                signal_members(members, sig)
            self.engine.loop.call_at(self.kill_at_s, self.engine.kill_overdue)
        elif now >= self.kill_at_s:
            signal_members(members, signal.SIGKILL)

    def close(self) -> None:
        """The loop is ending: read what is left, release fds, reap (after a kill)."""
        self.drain()
        for stream, _ in list(self._streams.values()):
            self.engine.loop.selector.unregister(stream)
            stream.close()
        self._streams.clear()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if self.alive and self.proc is not None:
            self.proc.wait()  # only after an emergency SIGKILL of the group
            self.alive = False

    # -- health checks ---------------------------------------------------------------------
    def _probe_tick(self, token: int) -> None:
        probe_run = self._probe
        if token != self.token or not self.alive or probe_run is None:
            return
        probe = probe_run.probe
        verdict = probe_run.tick(self.engine.clock())
        if verdict is Verdict.SUBMIT and probe is not None:
            check = probe.check
            self.engine.loop.submit(lambda: run_check(check), lambda f: self._probe_done(token, f))
        elif verdict is Verdict.UNHEALTHY:
            self._unhealthy(probe_run.detail)
            return
        if probe is not None:
            self.engine.loop.call_at(
                self.engine.clock() + probe.interval_s, lambda: self._probe_tick(token)
            )

    def _probe_done(self, token: int, future: Future[tuple[bool, str]]) -> None:
        probe_run = self._probe
        if token != self.token or not self.alive or probe_run is None:
            return
        ok, detail = future.result()
        verdict = probe_run.result(ok, detail)
        if verdict is Verdict.READY:
            self.state = WorkerState.READY
            self.engine.emit(Ready(self.engine.clock(), self.name))
        elif verdict is Verdict.UNHEALTHY:
            self._unhealthy(probe_run.detail)

    def _unhealthy(self, reason: str) -> None:
        self._probe = None
        self.engine.emit(Unhealthy(self.engine.clock(), self.name, reason))
        self.engine.member_failed(self, reason)
