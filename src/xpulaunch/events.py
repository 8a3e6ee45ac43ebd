"""Worker states, status snapshots and the events a :class:`Supervisor` reports.

State graph of one worker (the supervisor's loop thread is the only writer)::

    PENDING -> STARTING -> READY -> (exit) -> BACKOFF -> STARTING ...   restart
                  |          |                  \\-> EXITED              done / stopped
                  |          +-> STOPPING -> ...                        stop, gang stop,
                  +--------------^                                      failed health check
                                              (exit) -> FAILED          gave up

STARTING lasts until the readiness check passes; a worker without one is READY as soon as it
is running.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xpulaunch.root_cause import RootCause


class WorkerState(str, Enum):
    PENDING = "pending"  # not started yet
    STARTING = "starting"  # running, readiness check not passed yet
    READY = "ready"  # running (and ready, when it has a readiness check)
    BACKOFF = "backoff"  # down; will be started again after a delay
    STOPPING = "stopping"  # asked to stop; waiting for its processes to go
    EXITED = "exited"  # down for good: finished, or stopped on request
    FAILED = "failed"  # down for good: failed and the restart policy gave up


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """A snapshot of one worker; ``exit_code`` is the last run's shell-style exit status."""

    name: str
    state: WorkerState
    pid: int | None
    restarts: int
    attempt: int
    exit_code: int | None
    ready: bool


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every event; ``time_s`` is on the supervisor's clock."""

    time_s: float


@dataclass(frozen=True, slots=True)
class Started(Event):
    name: str
    pid: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Ready(Event):
    name: str


@dataclass(frozen=True, slots=True)
class Exited(Event):
    """A worker's main process ended. ``expected``: we had asked it to stop."""

    name: str
    pid: int
    exit_code: int  # shell style: 128 + N after signal N
    signal: str | None  # "SIGSEGV" when it died by a signal
    expected: bool
    stderr_tail: tuple[str, ...] = ()
    root_cause: RootCause | None = None  # a failed run's exception (error file or stderr)


@dataclass(frozen=True, slots=True)
class Unhealthy(Event):
    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class HangDetected(Event):
    """A worker wrote nothing (``watched`` "output") or did not beat ("heartbeat") for
    ``silent_s`` seconds; it is failed next (after a stack dump when py-spy is there)."""

    name: str
    pid: int
    silent_s: float
    watched: str


# The line above the stack dump a hang leaves in the worker's stderr (supervisor/hang.py): the
# console shows the dump as it comes, and so does not repeat it as the worker's last lines.
STACK_DUMP_HEADER = "xpulaunch: py-spy dump of the silent process:"


@dataclass(frozen=True, slots=True)
class TimedOut(Event):
    """The job ran for ``max_runtime_s``: every worker is stopped; exit status 124."""

    max_runtime_s: float


@dataclass(frozen=True, slots=True)
class Restarting(Event):
    names: tuple[str, ...]
    delay_s: float
    restart: int  # restarts so far, this one included
    reason: str


@dataclass(frozen=True, slots=True)
class GaveUp(Event):
    names: tuple[str, ...]
    exit_code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Stopping(Event):
    """A stop was requested; ``kill``: the second one, killing at once. ``cause``: "signal"
    (a signal to the supervisor), "stop" (``Supervisor.stop()``) or "max_runtime"."""

    signal: str
    kill: bool
    cause: str = "signal"


@dataclass(frozen=True, slots=True)
class SignalForwarded(Event):
    """A signal that does not stop the job (SIGUSR1, SIGUSR2: Slurm's warning before it
    preempts, ``sbatch --signal``) was sent on to the process groups of ``names``."""

    signal: str
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LeaseWaited(Event):
    """``xpulaunch run`` waits in line for devices (``--wait``); sent when its place or its
    reason changes."""

    waited_s: float
    position: int
    reason: str


@dataclass(frozen=True, slots=True)
class LeaseAcquired(Event):
    """The devices are leased (``devices``: their labels) after ``waited_s`` in line."""

    job_id: str
    devices: tuple[str, ...]
    waited_s: float


@dataclass(frozen=True, slots=True)
class LeaseReleased(Event):
    job_id: str
    devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Stopped(Event):
    """The supervisor has finished: every process of the job is gone."""

    exit_code: int
    reason: str
