"""What to run: :class:`WorkerSpec`, its health checks (:class:`Probe`), and the variables
that the supervisor adds to a worker's environment when it starts it (:func:`start_env`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpulaunch.model import ERROR_FILE_VAR, JOB_ID_VAR, RESTART_COUNT_VAR, WORKER_VAR

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence


@dataclass(frozen=True, slots=True)
class Probe:
    """A health check (readiness or liveness). ``check`` returns True when healthy; it must
    return (or raise ``OSError``, which counts as a failure) within ``timeout_s``. It runs on
    a helper thread, never on the supervisor's loop."""

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
    readiness: Probe | None = None
    liveness: Probe | None = None
    prepare: Callable[[int], WorkerSpec] | None = None


def start_env(
    env: Mapping[str, str], *, job_id: str, worker: str, attempt: int, error_file: str = ""
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
    return {**env, **started}
