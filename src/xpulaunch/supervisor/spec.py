r"""What to run and how: :class:`WorkerSpec`, its :class:`HealthCheck`\ s, the
:class:`SupervisorSettings`, and the variables that the supervisor adds to a worker's
environment when it starts it (:func:`start_env`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from xpulaunch.joblog.logs import LogConfig
from xpulaunch.model import (
    ERROR_FILE_VAR,
    HEARTBEAT_FILE_VAR,
    JOB_ID_VAR,
    RESTART_COUNT_VAR,
    WORKER_VAR,
)
from xpulaunch.supervisor.restart import RestartPolicy

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """A health check of a worker (readiness or liveness). ``check`` returns True when
    healthy; it must return (or raise ``OSError``, which counts as a failure) within
    ``timeout_s``. It runs on a helper thread, never on the supervisor's loop."""

    check: Callable[[], bool]
    interval_s: float = 1.0
    timeout_s: float = 2.0
    failure_threshold: int = 3  # consecutive failures before a live worker is unhealthy
    start_deadline_s: float = 600.0  # readiness only: not ready after this long = failed


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One worker. ``env`` is the complete child environment but for what :func:`start_env`
    adds. ``prepare(attempt)`` is called before every start, ``attempt`` counting from 0, and
    returns the spec to start (for example with a new port after a failed bind)."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str | None = None
    pass_fds: tuple[int, ...] = ()
    readiness: HealthCheck | None = None
    liveness: HealthCheck | None = None
    prepare: Callable[[int], WorkerSpec] | None = None


@dataclass(frozen=True, slots=True)
class SupervisorSettings:
    """How a :class:`~xpulaunch.supervisor.supervisor.Supervisor` runs its workers.

    ``lease_fds`` (flock'd device leases) are held by the workers and the guardian until every
    process of the job is gone; with ``release_leases`` the supervisor unlocks them as soon as
    it has seen every process of the job gone (``xpulaunch run``). ``record_dir`` defaults to
    the user's runtime dir; ``job_id`` (default: a random one) is the ``XPULAUNCH_JOB_ID``
    every process of the job carries. ``hang_timeout_s``: a worker silent that long (no
    output; with ``heartbeat``, no :func:`xpulaunch.heartbeat`) is failed;
    ``max_runtime_s``: the job is stopped after that long, with exit status 124.
    """

    policy: RestartPolicy = field(default_factory=RestartPolicy)
    grace_s: float = 10.0
    logs: LogConfig = field(default_factory=LogConfig)
    lease_fds: tuple[int, ...] = ()
    release_leases: bool = False
    record_dir: str | None = None
    job_id: str | None = None
    hang_timeout_s: float | None = None
    heartbeat: bool = False
    max_runtime_s: float | None = None


def heartbeat_path(run_dir: Path, attempt: int, name: str) -> Path:
    return run_dir / f"attempt_{attempt}" / f"{name}.heartbeat"


def start_env(
    env: Mapping[str, str],
    *,
    job_id: str,
    worker: str,
    attempt: int,
    error_file: str = "",
    heartbeat_file: str = "",
) -> dict[str, str]:
    """``env`` plus the variables known only when a worker starts (``model.SET_AT_START``).

    ``XPULAUNCH_JOB_ID`` and ``XPULAUNCH_WORKER`` mark every descendant of the worker, so the
    supervisor, the guardian and the record sweep find them (:mod:`xpulaunch.processes.procfs`);
    ``TORCHELASTIC_RESTART_COUNT`` is the attempt number and ``TORCHELASTIC_ERROR_FILE``
    this attempt's own error file, as torchrun sets them (the inherited one, if any, is
    replaced: every rank writing one file would leave only the last rank's error).
    """
    started = {JOB_ID_VAR: job_id, WORKER_VAR: worker, RESTART_COUNT_VAR: str(attempt)}
    if error_file:
        started[ERROR_FILE_VAR] = error_file
    if heartbeat_file:
        started[HEARTBEAT_FILE_VAR] = heartbeat_file
    return {**env, **started}
