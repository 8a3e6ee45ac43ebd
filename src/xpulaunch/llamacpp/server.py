"""Run a :class:`~xpulaunch.llamacpp.plan.LlamaPlan`: one supervised llama-server per replica.

The :class:`~xpulaunch.supervisor.supervisor.Supervisor` owns the processes, their logs, restarts
and cleanup. This module adds what is llama-specific:

* readiness and liveness probes on ``GET /health`` (503 while loading, 200 once ready), with a
deadline;
* start-up failures are final: a replica that exits or misses its deadline before it was
  ever ready stops the whole start with its log's error line (no point restarting a wrong
  model path five times), except a lost port race (below) and a kill from outside
  (:data:`OUTSIDE_SIGNALS`), which the restart policy answers;
* after a replica was ready once it is restarted, with backoff, whenever it exits or stops
  answering (llama-swap only notices exits);
* ports: a free port is found by bind-and-close, which races with other programs. When llama-server
then logs ``couldn't bind HTTP server socket``, or another program listens on the port when a
  restart begins, and the port was not fixed by the user, ``WorkerSpec.prepare`` moves the
  replica to another free port for its next attempt. A fixed port that is taken ends the start
  with a one-line error naming who holds it;
* a replica is ready, and stays healthy, only while the socket listening on its port belongs
  to the process started for it (:class:`~xpulaunch.processes.ports.PortOwner`): another
  program on that port answers ``/health`` too, and would get the model's requests.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from xpulaunch.errors import ServerStartError, UsageError
from xpulaunch.events import (
    Event,
    Exited,
    GaveUp,
    Ready,
    Restarting,
    Started,
    Stopped,
    Stopping,
    Unhealthy,
)
from xpulaunch.joblog.logs import LogConfig
from xpulaunch.llamacpp.args import with_port
from xpulaunch.llamacpp.health import answers_checks, free_port, health_status
from xpulaunch.llamacpp.plan import LlamaPlan, Replica
from xpulaunch.processes import records
from xpulaunch.processes.ports import PortOwner, taken
from xpulaunch.supervisor.restart import RestartMode, RestartPolicy
from xpulaunch.supervisor.spec import HealthCheck, WorkerSpec
from xpulaunch.supervisor.supervisor import Supervisor

if TYPE_CHECKING:
    from xpulaunch.leases.manager import Lease
    from xpulaunch.llamacpp.engine import Engine

BIND_FAILURE = "couldn't bind HTTP server socket"  # tools/server/server-http.cpp
# llama.cpp log lines: "0.00.006.413 E srv  load_model: failed ..." (time, level, text).
_LOG_LINE = re.compile(r"^\s*[\d.]+\s+(?P<level>[DIWE])\s+(?P<text>.*)$")

# Signals that come from outside the server (the OOM killer's SIGKILL, an operator's TERM):
# a start they cut short may well succeed the next time, so the restart policy applies. A
# server that crashes by itself (SIGSEGV, SIGABRT from a GGML_ASSERT on a bad model) fails
# the same way every time, and still fails the start at once.
OUTSIDE_SIGNALS = frozenset({"SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"})

DEFAULT_POLICY = RestartPolicy(mode=RestartMode.ALWAYS, max_restarts=5, gang=False)


@dataclass(frozen=True, slots=True)
class HealthOptions:
    """How replicas are probed. ``ready_timeout_s``: how long one start may take to load."""

    ready_timeout_s: float = 600.0
    ready_interval_s: float = 0.5
    interval_s: float = 2.0
    timeout_s: float = 2.0
    failure_threshold: int = 3

    def __post_init__(self) -> None:
        for name in ("ready_timeout_s", "ready_interval_s", "interval_s", "timeout_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise UsageError(f"health {name} {value}: expected a number of seconds > 0")
        if self.failure_threshold < 1:
            raise UsageError(f"health failure_threshold {self.failure_threshold}: expected >= 1")


def error_line(lines: Sequence[str], *, or_last: bool = True) -> str | None:
    """The most telling line of a llama-server log tail: its first error line; else, with
    ``or_last``, its last line (None when there is nothing to show)."""
    for line in lines:
        match = _LOG_LINE.match(line)
        if match is not None and match["level"] == "E":
            return str(match["text"]).strip()
    for line in reversed(lines if or_last else ()):
        if line.strip():
            match = _LOG_LINE.match(line)
            return (match["text"] if match else line).strip()
    return None


class _Slot:
    """One replica's mutable state. Its port is read by probe threads and changed only by
    ``prepare`` on the supervisor's loop thread, between runs (no probe runs then)."""

    def __init__(self, replica: Replica, spec: WorkerSpec) -> None:
        self.replica, self.spec = replica, spec
        self.ready_once = False
        self.last_exit: Exited | None = None
        self.pid: int | None = None  # the current run's (set on the loop, read by checks)
        self.owner = PortOwner()
        self.distrusted: int | None = None  # the run whose port was found held by another


class LlamaServer:
    """Supervised llama-server replicas; a context manager (``start`` ... ``stop``)."""

    def __init__(
        self,
        plan: LlamaPlan,
        parent_env: Mapping[str, str],
        *,
        health: HealthOptions = HealthOptions(),
        policy: RestartPolicy = DEFAULT_POLICY,
        grace_s: float = 5.0,
        logs: LogConfig = LogConfig(),  # noqa: B008 (frozen value)
        on_ready: Callable[[Replica], None] | None = None,
        on_message: Callable[[str], None] | None = None,
        on_event: Callable[[Event], None] | None = None,
        lease_fds: tuple[int, ...] = (),
        release_leases: bool = False,
        settle: Callable[[Sequence[str]], None] | None = None,
        record_dir: str | os.PathLike[str] | None = None,
        job_id: str | None = None,
        lease: Lease | None = None,
        engine: Engine | None = None,
    ) -> None:
        """``job_id``: the lease's (see :class:`~xpulaunch.supervisor.supervisor.Supervisor`).
        ``on_ready(replica)`` runs on the supervisor's thread each time a replica becomes
        ready (again, after a restart); ``on_message`` gets start-up problems, one line each
        (default: the supervisor's console); ``record_dir`` is the supervisor's job-record
        directory (default: the user's runtime dir, as for ``xpulaunch run``);
        ``release_leases``: unlock ``lease_fds`` as soon as every process is gone (see
        :class:`~xpulaunch.supervisor.supervisor.Supervisor`), for a caller that frees the
        devices while it runs on (the model router). ``lease``: the lease of ``lease_fds``,
        which this server owns (``serve_llama``): :meth:`stop` releases it. ``engine``: the
        replicas run a model's own server (:mod:`~xpulaunch.llamacpp.engine`), not
        llama-server: its command line on each port, ready once its check path answers."""
        self.plan = plan
        self.engine = engine
        self._what = "llama-server" if engine is None else engine.name
        self._lease = lease
        self._health = health
        self._on_ready, self._on_message, self._on_event = on_ready, on_message, on_event
        self._cond = threading.Condition()
        self._failure: ServerStartError | None = None
        self._stopped: Stopped | None = None
        self._started = False
        self._signalled = False  # set by send_stop_signal: only a signal's stop is announced
        self._slots: dict[str, _Slot] = {}
        for replica, worker in zip(plan.replicas, plan.plan.workers, strict=True):
            spec = self._spec(replica, worker.argv, worker.child_env(parent_env), lease_fds)
            self._slots[replica.name] = _Slot(replica, spec)
        # Replicas are independent servers: never a gang, whatever the policy says.
        self.supervisor = Supervisor(
            [s.spec for s in self._slots.values()],
            replace(policy, gang=False),
            grace_s=grace_s,
            logs=logs,
            on_event=self._event,
            lease_fds=lease_fds,
            release_leases=release_leases,
            settle=settle,
            record_dir=record_dir or records.runtime_dir(parent_env),
            job_id=job_id,
        )

    # -- specs -------------------------------------------------------------------------
    def _spec(
        self,
        replica: Replica,
        argv: Sequence[str],
        env: dict[str, str],
        lease_fds: tuple[int, ...],
    ) -> WorkerSpec:
        health, name = self._health, replica.name

        def answers() -> bool:
            now = self._slots[name].replica  # its port may have moved
            if self.engine is not None:
                return answers_checks(now.host, now.port, health.timeout_s, self.engine.checks)
            return health_status(now.host, now.port, health.timeout_s) == 200  # 503: loading

        ready = HealthCheck(
            lambda: answers() and self._ours(name, live=False),
            health.ready_interval_s,
            health.timeout_s,
            1,
            health.ready_timeout_s,
        )
        alive = HealthCheck(
            lambda: answers() and self._ours(name, live=True),
            health.interval_s,
            health.timeout_s,
            health.failure_threshold,
        )
        return WorkerSpec(
            name,
            argv,
            env,
            pass_fds=lease_fds,
            readiness=ready,
            liveness=alive,
            prepare=lambda attempt: self._prepare(name, attempt),
        )

    def _ours(self, name: str, *, live: bool) -> bool:
        """After ``/health`` answered: whether the answer came from the server started for
        the replica. Else raises ``ConnectionError`` naming who holds the port (a failed
        check); a fixed port held by another program fails the start at once, and a ready
        replica is reported unhealthy at once, not after ``failure_threshold`` checks."""
        slot = self._slots[name]
        replica, pid = slot.replica, slot.pid
        problem = slot.owner.problem(replica.host, replica.port, pid)
        if problem is None:
            return True
        if live and slot.distrusted != pid:
            slot.distrusted = pid
            # Posted as the supervisor posts its own: the router stops sending it requests now.
            self._event(Unhealthy(time.monotonic(), name, problem))
        elif not live and replica.port_fixed and not slot.ready_once:
            self._fail(
                f"{self._what} {name}: port {problem}; choose another --port, or leave "
                "--port out for free ports"
            )
        raise ConnectionError(problem)

    def _prepare(self, name: str, attempt: int) -> WorkerSpec:
        """Before each start: a replica that lost its port to another program moves on (the
        program may have taken it after a crash: then before its bind fails)."""
        slot = self._slots[name]
        last = slot.last_exit
        lost_port = last is not None and any(BIND_FAILURE in line for line in last.stderr_tail)
        holder = None if attempt == 0 else taken(slot.replica.host, slot.replica.port)
        if attempt > 0 and (lost_port or holder) and not slot.replica.port_fixed:
            used = {s.replica.port for s in self._slots.values()}
            port = free_port(slot.replica.host, exclude=used)
            by = f" by {holder}" if holder else ""
            self._say(f"replica {name}: port {slot.replica.port} was taken{by}; now on {port}")
            slot.replica = replace(slot.replica, port=port)
        port = slot.replica.port
        argv = self.engine.argv(port) if self.engine else with_port(slot.spec.argv, port)
        return replace(slot.spec, argv=argv, prepare=None)

    # -- events (on the supervisor's loop thread) ---------------------------------------
    def _event(self, event: Event) -> None:
        if isinstance(event, Started):
            self._slots[event.name].pid = event.pid
        elif isinstance(event, Ready):
            self._ready(event.name)
        elif isinstance(event, Exited):
            self._exited(event)
        elif isinstance(event, Unhealthy):
            self._unhealthy(event)
        elif isinstance(event, Restarting | GaveUp):
            self._restart_news(event)
        elif isinstance(event, Stopping) and self._signalled:
            if event.kill:
                self._say(f"{event.signal}: killing every llama-server now")
            else:
                self._say(f"{event.signal}: stopping llama-server (again to kill at once)")
        elif isinstance(event, Stopped):
            with self._cond:
                self._stopped = event
                self._cond.notify_all()
        if self._on_event is not None:
            self._on_event(event)

    def _ready(self, name: str) -> None:
        slot = self._slots[name]
        with self._cond:
            slot.ready_once = True
            self._cond.notify_all()
        if self._on_ready is not None:
            self._on_ready(slot.replica)

    def _exited(self, event: Exited) -> None:
        slot = self._slots[event.name]
        slot.last_exit = event
        if event.expected:
            return
        how = f"exited with code {event.exit_code}"
        if event.signal:
            how = f"was killed by {event.signal}"
        if slot.ready_once:
            why = error_line(event.stderr_tail, or_last=event.signal is None)
            self._say(f"replica {event.name} {how}" + (f": {why}" if why else ""))
            return
        replica, tail = slot.replica, event.stderr_tail
        if event.signal in OUTSIDE_SIGNALS:
            return  # killed from outside while loading (OOM killer, operator): policy decides
        if any(BIND_FAILURE in line for line in tail):
            if not replica.port_fixed:
                return  # _prepare moves it to another port for the next attempt
            holder = taken(replica.host, replica.port)
            by = f" by {holder}" if holder else ""
            self._fail(
                f"port {replica.port} on {replica.host} is already in use{by} (llama-server: "
                f"{BIND_FAILURE}); choose another --port, or leave --port out for free ports"
            )
            return
        for line in tail[-10:]:
            self._say(f"  [{event.name}] {line}")
        why = error_line(tail) or "no output"
        self._fail(f"{self._what} {event.name} {how} before it was ready: {why}")

    def _unhealthy(self, event: Unhealthy) -> None:
        slot = self._slots[event.name]
        if slot.ready_once:
            self._say(f"replica {event.name} ({slot.replica.url}) is unhealthy: {event.reason}")
        else:
            self._fail(f"{self._what} {event.name} at {slot.replica.url}: {event.reason}")

    def _restart_news(self, event: Restarting | GaveUp) -> None:
        """After start-up, say what the supervisor does; before it, a give-up is fatal."""
        for name in event.names:
            slot = self._slots[name]
            if isinstance(event, GaveUp) and not slot.ready_once:
                last = slot.last_exit
                why = error_line(last.stderr_tail) if last else None
                detail = f" (last run: {why})" if why else ""
                self._fail(f"{self._what} {name} could not be started{detail}: {event.reason}")
            elif isinstance(event, GaveUp):
                self._say(f"replica {name} failed for good: {event.reason}")
            elif slot.ready_once:
                self._say(f"replica {name}: {event.reason}")

    def _fail(self, message: str) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = ServerStartError(message)
            self._cond.notify_all()

    def _say(self, text: str) -> None:
        if self._on_message is not None:
            self._on_message(text)
        else:
            self.supervisor.message(text)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> tuple[str, ...]:
        """Start every replica and block until each answers ``/health`` with 200.

        Returns the URLs. Raises :class:`ServerStartError` (after stopping everything) when a
        replica fails before it was ready, and ``LaunchError`` when llama-server cannot be
        started at all.
        """
        if self._started:
            return self.urls
        self._started = True
        self.supervisor.start()
        try:
            with self._cond:
                self._cond.wait_for(self._settled)
                failure, stopped = self._failure, self._stopped
        except BaseException:
            self.supervisor.stop(0)
            raise
        if failure is None and stopped is not None:
            failure = ServerStartError(
                f"llama-server stopped before every replica was ready ({stopped.reason})",
                exit_code=stopped.exit_code or 1,
            )
        if failure is not None:
            self.supervisor.stop()
            raise failure
        return self.urls

    def _settled(self) -> bool:
        ready = all(s.ready_once for s in self._slots.values())
        return ready or self._failure is not None or self._stopped is not None

    @property
    def replicas(self) -> tuple[Replica, ...]:
        """The replicas as they are now (a replica moved to a new port shows it)."""
        return tuple(s.replica for s in self._slots.values())

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(r.url for r in self.replicas)

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until every replica is down for good; the exit status (None: timeout)."""
        return self.supervisor.wait(timeout)

    def stop(self, grace_s: float | None = None) -> int:
        try:
            return self.supervisor.stop(grace_s)
        finally:
            if self._lease is not None:
                self._lease.release()  # the devices are free once no replica holds them

    def send_stop_signal(self, signum: int) -> None:
        """For a signal handler: stop gracefully (a second call kills at once).

        It only posts to the supervisor's loop and takes no lock: a handler may interrupt
        code on this thread that holds one (the console's, while a line is written), and a
        second Ctrl-C would then wait on it forever. The loop reports the stop as a
        ``Stopping`` event, which :meth:`_event` prints."""
        self._signalled = True  # a plain store: atomic, lock-free
        self.supervisor.send_stop_signal(signum)

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
