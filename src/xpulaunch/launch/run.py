"""``run_plan``: execute a :class:`~xpulaunch.model.Plan` under the supervisor.

This is what ``xpulaunch run`` calls once the plan is made. It turns each planned worker into
a :class:`WorkerSpec` (the plan's env applied to ``parent_env``: every variable known when the
plan was made; the supervisor adds the ones set at start, :data:`xpulaunch.model.SET_AT_START`),
chooses gang or independent restarts from ``plan.isolate``, forwards SIGINT, SIGTERM and
SIGHUP, prints a failure summary, and returns the exit status: 0, the first failing worker's
status, or 128 + N when stopped by signal N.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xpulaunch.core.restart import RestartMode, RestartPolicy
from xpulaunch.errors import UsageError
from xpulaunch.events import (
    Event,
    Exited,
    GaveUp,
    HangDetected,
    Restarting,
    Stopping,
    TimedOut,
    Unhealthy,
)
from xpulaunch.joblog.event_stream import EventStream
from xpulaunch.joblog.logs import LogConfig, LogLayout, make_run_log_dir
from xpulaunch.joblog.run_summary import RunSummary
from xpulaunch.launch.gpu_settle import NvmlSettle
from xpulaunch.launch.options import (
    DEFAULT_BACKOFF,
    make_log_dir,
    operations_settings,
    parse_backoff,
    parse_ranks,
    parse_seconds,
    restart_limit,
    restart_settings,
)
from xpulaunch.model import Backend, Plan
from xpulaunch.processes import records
from xpulaunch.processes.cgroup import check_cgroup_setting
from xpulaunch.processes.program import resolve_program
from xpulaunch.processes.signals import forwarding
from xpulaunch.supervisor.spec import WorkerSpec
from xpulaunch.supervisor.supervisor import Supervisor

if TYPE_CHECKING:  # a job of one node never imports the meeting's sockets
    from xpulaunch.launch.nodes import Meeting


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How ``xpulaunch run`` supervises; :meth:`from_cli` reads the command's options.

    ``gang`` None: gang restarts unless the plan isolates its workers. ``max_restarts``
    None: no limit. ``console_ranks``: worker names shown on the console (None: all).
    """

    restart: RestartMode = RestartMode.NO
    max_restarts: int | None = 3
    backoff_initial_s: float = 1.0
    backoff_factor: float = 2.0
    backoff_max_s: float = 30.0
    stable_window_s: float = 60.0
    grace_s: float = 10.0
    gang: bool | None = None
    log_dir: str | os.PathLike[str] | None = None
    log_layout: LogLayout = LogLayout.XPULAUNCH  # torchrun's: log_dir is the run's own dir
    console_ranks: frozenset[str] | None = None
    color: bool | None = None
    cwd: str | None = None
    hang_timeout_s: float | None = None
    heartbeat: bool = False
    max_runtime_s: float | None = None
    events: str | None = None  # a file, or "-" for standard output
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_interval_s: float = 10.0

    @classmethod
    def from_cli(cls, values: Mapping[str, Any]) -> RunOptions:
        """From the command's keyword arguments (others are ignored); creates ``--log-dir``."""
        restart, max_restarts = restart_settings(values)
        first_s, cap_s, factor = parse_backoff(str(values.get("backoff") or DEFAULT_BACKOFF))
        layout = LogLayout(values.get("log_layout") or LogLayout.XPULAUNCH)
        log_dir = make_log_dir(values.get("log_dir"))
        check_cgroup_setting(os.environ)  # before anything is leased or said
        return cls(
            restart=restart,
            max_restarts=max_restarts,
            backoff_initial_s=first_s,
            backoff_max_s=cap_s,
            backoff_factor=factor,
            stable_window_s=parse_seconds(values.get("stable_window"), "--stable-window", 60.0),
            grace_s=parse_seconds(values.get("grace"), "--grace", 10.0),
            gang=values.get("gang"),
            log_dir=make_run_log_dir(log_dir, layout, values.get("log_run_id")),
            log_layout=layout,
            console_ranks=parse_ranks(values.get("ranks")),
            color=False if values.get("no_color") else None,
            **operations_settings(values),
        )

    @property
    def restart_limit(self) -> int | None:
        """The plan's ``max_restarts`` for these options: 0 when restarts are off, None for
        no limit (see :func:`xpulaunch.plan`)."""
        return restart_limit(self.restart, self.max_restarts)

    def policy(self, plan: Plan) -> RestartPolicy:
        return RestartPolicy(
            mode=self.restart,
            max_restarts=self.max_restarts,
            backoff_initial_s=self.backoff_initial_s,
            backoff_factor=self.backoff_factor,
            backoff_max_s=self.backoff_max_s,
            stable_window_s=self.stable_window_s,
            gang=not plan.isolate if self.gang is None else self.gang,
        )


def run_plan(
    plan: Plan,
    parent_env: Mapping[str, str],
    options: RunOptions,
    lease_fds: tuple[int, ...] = (),
    *,
    release_leases: bool = False,
    job_id: str | None = None,
    events: EventStream | None = None,
    earlier_events: Sequence[Event] = (),
    meeting: Meeting | None = None,
) -> int:
    """Run every worker of ``plan``; block until the job is over; return its exit status.

    ``lease_fds`` go to every worker and the guardian; with ``release_leases`` they are
    unlocked as soon as every process of the job is gone; ``job_id`` (the lease's) becomes the
    workers' ``XPULAUNCH_JOB_ID`` (see :class:`Supervisor`). ``events``: an open stream for
    the supervisor's events (the caller's, left open), else ``options.events`` is opened;
    ``earlier_events`` (the lease's, already written there) reach the summary and metrics.
    With ``options.log_dir``, ``summary.json`` is written there at the end. ``meeting``: this
    node's part in a static job of several nodes; the nodes meet before the first start and
    before every gang restart (see :mod:`xpulaunch.launch.nodes`)."""
    policy = options.policy(plan)
    specs = specs_for_plan(plan, parent_env, cwd=options.cwd, lease_fds=lease_fds)
    check_ranks(options.console_ranks, [s.name for s in specs])
    # Waiting for GPU memory and for the other nodes matters only before a restart.
    restarts = policy.mode is not RestartMode.NO
    gpus = gpu_settle(plan) if restarts else None
    rejoin = meeting if restarts and policy.gang else None
    logs = LogConfig(
        log_dir=options.log_dir,
        layout=options.log_layout,
        console_names=options.console_ranks,
        color=_colour(options.color, parent_env),
    )
    reporter = Reporter(len(specs))

    def say(text: str) -> None:  # a restart's meeting speaks once the supervisor below runs
        supervisor.message(text)

    listeners: list[Callable[[Event], None]] = [reporter.on_event]
    supervisor = Supervisor(
        specs, policy, grace_s=options.grace_s, logs=logs,
        on_event=_fan_out(listeners),
        lease_fds=lease_fds, release_leases=release_leases, settle=_settle(gpus, rejoin, say),
        record_dir=records.runtime_dir(parent_env), job_id=job_id,
        hang_timeout_s=options.hang_timeout_s, heartbeat=options.heartbeat,
        max_runtime_s=options.max_runtime_s,
    )  # fmt: skip
    reporter.supervisor = supervisor
    if meeting is not None:
        from xpulaunch.launch.nodes import meet

        meet(meeting, supervisor.message)
    with Operations(plan, options, supervisor, events) as operations:
        listeners.extend(operations.listeners)
        for event in earlier_events:
            operations.replay(event)
        with forwarding(reporter.on_signal):
            supervisor.start()
            status = supervisor.wait()
    for note in gpus.notes if gpus is not None else ():
        supervisor.message(note)
    return 1 if status is None else status


def _settle(
    gpus: NvmlSettle | None, meeting: Meeting | None, say: Callable[[str], None]
) -> Callable[[Sequence[str]], None] | None:
    """The supervisor's ``settle`` hook: the GPUs' memory released, then (several static
    nodes) every node met again, its old workers gone; a meeting that fails raises
    :class:`~xpulaunch.errors.LaunchError`, which fails the gang instead of restarting it.
    ``say`` is called only once the supervisor runs."""
    if meeting is None:
        return gpus
    from xpulaunch.launch.nodes import meet

    def settle(names: Sequence[str]) -> None:
        if gpus is not None:
            gpus(names)
        meet(meeting, say)

    return settle


def _fan_out(listeners: list[Callable[[Event], None]]) -> Callable[[Event], None]:
    """One ``on_event`` that calls every listener (the list may grow before the start)."""

    def on_event(event: Event) -> None:
        for listen in listeners:
            listen(event)

    return on_event


class Operations:
    """What a run offers an operator besides its console: the event stream, ``summary.json``
    and the metrics endpoint; each only when its option asks for it."""

    def __init__(
        self, plan: Plan, options: RunOptions, supervisor: Supervisor, events: EventStream | None
    ) -> None:
        self._options = options
        self._own_events = events is None and options.events is not None
        self.events = EventStream(options.events) if self._own_events and options.events else events
        devices = [u.label() for u in plan.devices]
        argv = plan.workers[0].argv if plan.workers else ()
        self.summary = RunSummary(supervisor.job_id, argv, devices) if options.log_dir else None
        self.metrics = None
        if options.metrics_port is not None:
            from xpulaunch.joblog.metrics import MetricsServer

            self.metrics = MetricsServer(
                supervisor, plan, host=options.metrics_host, port=options.metrics_port,
                interval_s=options.metrics_interval_s,
            )  # fmt: skip
            url = f"http://{options.metrics_host}:{self.metrics.port}/metrics"
            supervisor.message(f"metrics on {url}")

    @property
    def listeners(self) -> list[Callable[[Event], None]]:
        found = [self.events.write if self.events else None,
                 self.summary.on_event if self.summary else None,
                 self.metrics.on_event if self.metrics else None]  # fmt: skip
        return [f for f in found if f is not None]

    def replay(self, event: Event) -> None:
        """An event from before the supervisor (the lease's): not for the stream again."""
        for listen in (self.summary, self.metrics):
            if listen is not None:
                listen.on_event(event)

    def __enter__(self) -> Operations:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.summary is not None and self._options.log_dir is not None:
            self.summary.write(self._options.log_dir)
        if self.events is not None and self._own_events:
            self.events.close()


def specs_for_plan(
    plan: Plan,
    parent_env: Mapping[str, str],
    *,
    cwd: str | None = None,
    lease_fds: tuple[int, ...] = (),
) -> list[WorkerSpec]:
    """One spec per planned worker: its complete environment, and its program resolved and
    checked with that environment's ``PATH`` before anything starts (a one-line
    :class:`~xpulaunch.errors.LaunchError` otherwise)."""
    specs = []
    for worker in plan.workers:
        env = worker.child_env(parent_env)
        argv = resolve_program(worker.argv, env=env, cwd=cwd, python_scripts=False).argv
        specs.append(WorkerSpec(worker.name, argv, env, cwd=cwd, pass_fds=lease_fds))
    return specs


def check_ranks(ranks: frozenset[str] | None, names: list[str]) -> None:
    """``--ranks`` names only workers that exist (a one-line UsageError otherwise)."""
    unknown = sorted((ranks or frozenset()) - set(names))
    if unknown:
        raise UsageError(
            f"--ranks {','.join(unknown)}: no such worker; the workers are {','.join(names)}"
        )


def _colour(choice: bool | None, parent_env: Mapping[str, str]) -> bool:
    if choice is not None:
        return choice
    streams = (sys.stdout, sys.stderr)  # None where Python started with one closed (>&-)
    return not parent_env.get("NO_COLOR") and all(s is not None and s.isatty() for s in streams)


def gpu_settle(plan: Plan) -> NvmlSettle | None:
    """For CUDA plans, the Supervisor's ``settle`` hook: before a restart, wait (bounded)
    until the workers' GPUs released their memory (NVML only, never torch). Call it before
    starting: it records each device's baseline."""
    if plan.backend is not Backend.CUDA:
        return None
    devices = {
        w.name: [_device_id(plan, i) for i in (w.units or range(len(plan.devices)))]
        for w in plan.workers
    }
    settle = NvmlSettle({n: [d for d in ids if d] for n, ids in devices.items()})
    settle.baseline()
    return settle


def _device_id(plan: Plan, index: int) -> str | None:
    device = plan.devices[index].device
    return device.pci_bus_id or device.uuid


Failure = Exited | Unhealthy | HangDetected


class Reporter:
    """Turns supervisor events into the few lines a user needs, and the failure summary."""

    def __init__(self, workers: int) -> None:
        self.supervisor: Supervisor | None = None
        self._workers = workers
        self._failures: dict[str, Failure] = {}
        self._exits: dict[str, Exited] = {}

    def _say(self, text: str) -> None:
        if self.supervisor is not None:
            self.supervisor.message(text)

    def on_signal(self, signum: int) -> None:
        # A signal handler: it must take no lock (it may interrupt code holding one on
        # this same thread), so it only posts; the loop reports it as a Stopping event.
        if self.supervisor is not None:
            self.supervisor.send_stop_signal(signum)

    def on_event(self, event: Event) -> None:
        if isinstance(event, Exited):
            self._exits[event.name] = event
            if not event.expected and event.exit_code != 0:
                self._failures.setdefault(event.name, event)
        elif isinstance(event, Unhealthy):
            self._failures.setdefault(event.name, event)
        elif isinstance(event, HangDetected):
            self._failures.setdefault(event.name, event)
            silent = f"silent for {event.silent_s:.0f} s (no {event.watched})"
            self._say(f"worker {event.name} {silent}: treating it as failed")
        elif isinstance(event, TimedOut):
            self._say(f"ran for --max-runtime {event.max_runtime_s:g} s: stopping every worker")
        elif isinstance(event, Restarting):
            self._restarting(event)
        elif isinstance(event, GaveUp):
            self._gave_up(event)
        elif isinstance(event, Stopping) and (event.cause == "signal" or event.kill):
            what = "killing every process now" if event.kill else "stopping every worker"
            again = "" if event.kill else " (again to kill at once)"
            self._say(f"{event.signal}: {what}{again}")

    def _first_failure(self, names: Sequence[str]) -> Failure | None:
        failures = [self._failures[n] for n in names if n in self._failures]
        return min(failures, key=lambda e: e.time_s, default=None)

    def _what(self, failure: Failure) -> str:
        if isinstance(failure, Unhealthy):
            return f"was unhealthy ({failure.reason})"
        if isinstance(failure, HangDetected):
            return f"was silent for {failure.silent_s:.0f} s (no {failure.watched})"
        if failure.root_cause is not None:
            return f"raised {failure.root_cause.headline()} (exit status {failure.exit_code})"
        if failure.signal is not None:
            return f"was killed by {failure.signal} (exit status {failure.exit_code})"
        return f"exited with code {failure.exit_code}"

    def _restarting(self, event: Restarting) -> None:
        failure = self._first_failure(event.names)
        who = "" if failure is None else f"worker {failure.name} {self._what(failure)}; "
        scope = "all workers" if len(event.names) > 1 else f"worker {event.names[0]}"
        self._say(f"{who}restarting {scope}: {event.reason}")
        for name in event.names:
            self._failures.pop(name, None)

    def _gave_up(self, event: GaveUp) -> None:
        failure = self._first_failure(event.names)
        if failure is None:
            self._say(f"gave up ({event.reason}), exit status {event.exit_code}")
            return
        self._say(f"worker {failure.name} failed first: it {self._what(failure)}")
        self._say(f"gave up: {event.reason}")
        exited = self._exits.get(failure.name)
        tail = exited.stderr_tail if exited is not None else ()
        cause = exited.root_cause if exited is not None else None
        if cause is not None and cause.frames:
            self._say(f"where worker {failure.name} raised it (innermost last):")
            for frame in cause.frames:
                self._say(f"  {frame}")
        elif tail:
            self._say(f"last lines of worker {failure.name}'s stderr:")
            for line in tail[-10:]:
                self._say(f"  {line}")
        path = self.supervisor.log_path(failure.name) if self.supervisor else None
        if path is not None:
            self._say(f"full log: {path}")
