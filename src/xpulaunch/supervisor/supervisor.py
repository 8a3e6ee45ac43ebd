"""The Supervisor: start, watch, restart and stop a set of worker processes.

::

    spec = WorkerSpec("0", ["llama-server", "--port", "8080"], env=dict(os.environ),
                      readiness=HealthCheck(http_ok("http://127.0.0.1:8080/health")))
    with Supervisor([spec], SupervisorSettings(policy=RestartPolicy(gang=False))) as sup:
        if not sup.wait_ready(timeout=120):
            raise SystemExit("\\n".join(sup.tail("0")))
        sup.wait()

Threads: one loop thread (started by :meth:`Supervisor.start`) owns the worker table and is
the only one that spawns, signals or reaps workers (see :mod:`xpulaunch.supervisor.engine`). Every
public method only posts a request to it, or reads the snapshot it publishes.

Orphans: each worker gets ``PR_SET_PDEATHSIG=SIGKILL``; a guardian process
(:mod:`xpulaunch.processes.guardian`) kills the whole job if the supervisor's process dies; a
record file under the user's runtime dir is swept by the next start as a last resort.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpulaunch.errors import LaunchError, UsageError
from xpulaunch.events import Event, WorkerState, WorkerStatus
from xpulaunch.joblog.logs import LogConfig, LogLayout, LogSink, rank_folders
from xpulaunch.processes import records
from xpulaunch.processes.cgroup import check_cgroup_setting, job_cgroup
from xpulaunch.processes.guardian import GuardianHandle, start_guardian
from xpulaunch.processes.procfs import now_ticks, start_ticks
from xpulaunch.processes.signals import wait_answering
from xpulaunch.processes.spawn import ensure_open_files
from xpulaunch.supervisor.engine import Engine
from xpulaunch.supervisor.restart import RestartPolicy
from xpulaunch.supervisor.spec import HealthCheck, SupervisorSettings, WorkerSpec

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "HealthCheck",
    "LogConfig",
    "RestartPolicy",
    "Supervisor",
    "SupervisorSettings",
    "WorkerSpec",
    "WorkerState",
]


def _validate(workers: Sequence[WorkerSpec], settings: SupervisorSettings) -> None:
    if not isinstance(workers, list | tuple) or not all(isinstance(w, WorkerSpec) for w in workers):
        raise UsageError(
            "expected a list of WorkerSpec (xpulaunch.worker_specs(plan) makes them from a plan)",
            option="workers",
            value=workers,
        )
    if not workers:
        raise UsageError("no workers to supervise: give at least one WorkerSpec")
    names = [w.name for w in workers]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UsageError(f"worker names must be unique; repeated: {', '.join(duplicates)}")
    for spec in workers:
        if not spec.name or "/" in spec.name or spec.name in {".", ".."}:
            raise UsageError(f"worker name {spec.name!r}: expected a non-empty name without '/'")
        _check_command(spec)
    if not _seconds(settings.grace_s) or not settings.grace_s >= 0:  # NaN: neither
        raise UsageError("expected 0 or more seconds", option="grace_s", value=settings.grace_s)
    for name in ("hang_timeout_s", "max_runtime_s"):
        value = getattr(settings, name)
        if value is not None and not (_seconds(value) and 0 < value < float("inf")):
            raise UsageError("expected a number of seconds > 0", option=name, value=value)
    if settings.heartbeat and settings.hang_timeout_s is None:
        raise UsageError("heartbeat needs hang_timeout_s: how long without a beat is a hang")


def _check_command(spec: WorkerSpec) -> None:
    """What exec needs, checked before anything starts: the loop thread would otherwise die
    of Popen's TypeError or ValueError, and a string argv would run its first letter."""
    argv, env = spec.argv, spec.env
    if isinstance(argv, str | bytes) or not isinstance(argv, list | tuple):
        raise UsageError(
            f"worker {spec.name}: expected argv as a list of strings", option="argv", value=argv
        )
    if not argv:
        raise UsageError(f"worker {spec.name}: argv is empty")
    if not all(isinstance(arg, str) and "\0" not in arg for arg in argv):
        raise UsageError(
            f"worker {spec.name}: expected strings without NUL in argv", option="argv", value=argv
        )
    if not isinstance(env, Mapping):
        raise UsageError(
            f"worker {spec.name}: expected env as a mapping of strings (dict(os.environ), say)",
            option="env",
            value=env,
        )
    for name, value in env.items():
        if not (isinstance(name, str) and isinstance(value, str)):
            raise UsageError(f"worker {spec.name}: env {name!r}={value!r}: expected strings")
        if "=" in name or "\0" in name or "\0" in value:  # (an empty name execs fine)
            raise UsageError(
                f"worker {spec.name}: env {name!r}: expected a name without '=' "
                "and a value, neither with NUL"
            )


def _seconds(value: object) -> bool:
    """A number of seconds as a Python caller may give it (an int or a float, not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


class Supervisor:
    """Runs :class:`WorkerSpec` s under a :class:`RestartPolicy`; a context manager."""

    def __init__(
        self,
        workers: Sequence[WorkerSpec],
        settings: SupervisorSettings | RestartPolicy | None = None,
        *,
        on_event: Callable[[Event], None] | None = None,
        settle: Callable[[Sequence[str]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        **fields: Any,
    ) -> None:
        """``settings`` says how (a :class:`RestartPolicy` alone is the policy); ``fields``
        replace single settings (``grace_s=5``, ``logs=LogConfig(...)``). ``on_event`` sees
        every event on the supervisor's loop thread; ``settle(names)`` blocks (on a helper
        thread) until those workers' devices can be reused before they restart.

        Each worker's attempt gets its own ``TORCHELASTIC_ERROR_FILE`` (under the log dir,
        else in a private directory removed at the end), so the
        :class:`~xpulaunch.events.Exited` of a failed run carries its ``root_cause``."""
        if isinstance(settings, RestartPolicy):
            settings = SupervisorSettings(policy=settings)
        try:
            settings = replace(settings or SupervisorSettings(), **fields)
        except TypeError as exc:
            raise UsageError(f"Supervisor: {exc}") from None
        _validate(workers, settings)
        check_cgroup_setting(os.environ)
        self.settings = settings
        self._log_files_per_worker = _log_files_per_worker(settings.logs)
        self._specs = tuple(workers)
        self._sink = LogSink(
            settings.logs,
            [w.name for w in workers],
            folders=rank_folders({w.name: w.env for w in workers}),
        )
        self._on_event, self._settle, self._clock = on_event, settle, clock
        self._record_dir = os.fspath(settings.record_dir or records.runtime_dir(os.environ))
        self.job_id = _job_id(settings.job_id)
        self._engine: Engine | None = None
        self._thread: threading.Thread | None = None
        # Reentrant: stop() from a signal handler that interrupts start() on its own thread.
        self._lock = threading.RLock()
        self._starting = False
        self._early_signal: int | None = None
        self._early_failure: tuple[str, int] | None = None
        self._early_stop: tuple[float | None] | None = None  # stop() inside start()

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start every worker; raises :class:`LaunchError` (nothing left running) when a
        program cannot be started. Calling it again does nothing."""
        with self._lock:
            if self._engine is not None:
                return
            self._starting = True
            try:
                ensure_open_files(len(self._specs), self._log_files_per_worker)
                self._engine = self._make_engine()
                self._thread = threading.Thread(
                    target=self._engine.run, name="xpulaunch-supervisor", daemon=True
                )
                self._thread.start()
            finally:
                self._starting = False
        if self._early_signal is not None:  # a Ctrl-C that came while we were starting
            self._engine.request_stop(self._early_signal, None)
        if self._early_stop is not None:  # stop() in a signal handler while we were starting
            self._engine.request_stop(signal.SIGTERM, self._early_stop[0], by_signal=False)
        if self._early_failure is not None:
            self._engine.fail_gangs(*self._early_failure)
        self._engine.board.wait_started()
        if self._engine.launch_error is not None:
            status = self.wait()
            raise LaunchError(self._engine.launch_error, exit_code=status)

    def _make_engine(self) -> Engine:
        records.sweep(self._record_dir)
        since = now_ticks()
        record_file = os.path.join(self._record_dir, f"{self.job_id}.jsonl")
        cgroup = job_cgroup(self.job_id, os.environ)
        cgroup_path = cgroup.path if cgroup is not None else None
        settings = self.settings

        def new_guardian(lease_fds: tuple[int, ...]) -> GuardianHandle | None:
            return start_guardian(self.job_id, since, record_file, lease_fds, cgroup_path)

        watchdog = new_guardian(settings.lease_fds)
        header: dict[str, object] = {"since": since, "supervisor": _identity(os.getpid())}
        if watchdog is not None:
            header["guardian"] = _identity(watchdog.pid)
        if cgroup_path is not None:
            header["cgroup"] = cgroup_path
        record = records.JobRecord(self._record_dir, self.job_id, header)
        log_dir = settings.logs.log_dir
        return Engine(
            self._specs,
            settings,
            sink=self._sink,
            on_event=self._on_event,
            clock=self._clock,
            job_id=self.job_id,
            since_ticks=since,
            settle=self._settle,
            guardian=watchdog,
            record=record,
            run_dir=Path(log_dir or self._private_run_dir()),
            remove_run_dir=log_dir is None,
            cgroup=cgroup,
            restart_guardian=new_guardian,
        )

    def _private_run_dir(self) -> str:
        """Where the workers' error files go without ``--log-dir``: beside the job's record
        (the user's private runtime directory), else a new temporary directory."""
        path = os.path.join(self._record_dir, f"{self.job_id}.run")
        try:
            os.makedirs(path, mode=0o700)
        except OSError:
            import tempfile

            return tempfile.mkdtemp(prefix="xpulaunch-run-")
        return path

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until every worker is down for good; the exit status, or None on timeout.
        It waits in slices, so that the main thread's signal handlers run meanwhile
        (:func:`~xpulaunch.processes.signals.wait_answering`)."""
        engine, thread = self._engine, self._thread
        if engine is None or thread is None:
            raise UsageError("the supervisor was not started: call start() first")
        self._refuse_on_loop_thread()
        status = wait_answering(engine.wait, timeout)
        if status is not None:
            thread.join()
        return status

    def _refuse_on_loop_thread(self) -> None:
        if threading.current_thread() is self._thread:
            raise UsageError(
                "wait() and stop() cannot run inside on_event (the supervisor's own loop); "
                "call send_stop_signal() there instead"
            )

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once every worker is READY; False on timeout or when the job ended first."""
        if self._engine is None:
            raise UsageError("the supervisor was not started: call start() first")
        return self._engine.board.wait_ready(timeout)

    def stop(self, grace_s: float | None = None) -> int:
        """Stop every worker (SIGTERM, then SIGKILL after ``grace_s``); the exit status: 0
        unless a worker had failed for good before (a requested stop is a success). Called
        while another thread is in :meth:`start`, it waits for that start and stops the job;
        before any start, there is nothing to stop (0)."""
        with self._lock:  # held by another thread's start() until its engine runs
            if self._starting:  # a signal handler inside start(), on start's own thread
                self._early_stop = (grace_s,)
                return 0
            if self._engine is None:
                return 0
        self._refuse_on_loop_thread()  # before posting: a refused stop must not count
        self._engine.request_stop(signal.SIGTERM, grace_s, by_signal=False)
        status = self.wait()
        return 0 if status is None else status

    def send_stop_signal(self, signum: int) -> None:
        """What a signal handler calls: the first call forwards ``signum`` to every worker
        and stops the job gracefully; a second call kills everything at once. Takes no lock:
        a handler may interrupt :meth:`start` on the same thread."""
        engine = self._engine
        if engine is None:
            self._early_signal = signum
        else:
            engine.request_stop(signum, None)

    def fail(self, reason: str, exit_code: int = 1) -> None:
        """Fail the running workers from outside, as if one of them had failed (another
        node of the job failed): they are stopped, then restarted or not as the restart
        policy says. ``reason`` goes into the restart's or the give-up's reason;
        ``exit_code`` is the job's status if it gives up without a worker of its own failed.
        Takes no lock; before :meth:`start`, the workers fail as soon as they start."""
        engine = self._engine
        if engine is None:
            self._early_failure = (reason, exit_code)
        else:
            engine.fail_gangs(reason, exit_code)

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` on to every running worker's process group, stopping nothing
        (SIGUSR1 before a preemption, say); a :class:`~xpulaunch.events.SignalForwarded`
        event follows. What a signal handler may call: takes no lock."""
        engine = self._engine
        if engine is not None:
            engine.forward_signal(signum)

    # -- observation -------------------------------------------------------------------
    def status(self) -> list[WorkerStatus]:
        if self._engine is None:
            return [_pending(s.name) for s in self._specs]
        return self._engine.board.statuses()

    def tail(self, name: str, lines: int = 20) -> list[str]:
        """The last ``lines`` lines a worker wrote (stdout and stderr, in order)."""
        if name not in {s.name for s in self._specs}:
            raise UsageError(f"no worker named {name!r}")
        return self._sink.tail(name, lines)

    def events(self) -> list[Event]:
        return [] if self._engine is None else self._engine.board.events()

    def log_path(self, name: str) -> Path | None:
        """The log file of ``name``'s current attempt (with ``LogConfig.log_dir``); in
        torchrun's layout the worker's folder."""
        return self._sink.log_path(name)

    def message(self, text: str) -> None:
        """Write one ``xpulaunch:`` line through the same lock as the workers' output."""
        self._sink.message(text)

    def __enter__(self) -> Supervisor:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _log_files_per_worker(logs: LogConfig) -> int:
    """Files each worker's log keeps open: none without a log dir, stdout.log and stderr.log
    in torchrun's layout, one file in ours."""
    if logs.log_dir is None:
        return 0
    return 2 if logs.layout == LogLayout.TORCHRUN else 1


def _job_id(given: str | None) -> str:
    """A random id, or ``given`` when it is safe in a file name and an environment value."""
    if given is None:
        return os.urandom(8).hex()
    if not given or not all(c.isascii() and (c.isalnum() or c in "-_") for c in given):
        raise UsageError(f"job id {given!r}: expected letters, digits, '-' or '_'")
    return given


def _pending(name: str) -> WorkerStatus:
    return WorkerStatus(name, WorkerState.PENDING, None, 0, 0, None, False)


def _identity(pid: int) -> list[int] | None:
    ticks = start_ticks(pid)
    return None if ticks is None else [pid, ticks]
