"""What to run: :class:`WorkerSpec` and its health :class:`Probe` s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence


@dataclass(frozen=True, slots=True)
class Probe:
    """A health check. ``check`` returns True when healthy; it must return (or raise
    ``OSError``, which counts as a failure) within ``timeout_s``. It runs on a helper
    thread, never on the supervisor's loop."""

    check: Callable[[], bool]
    interval_s: float = 1.0
    timeout_s: float = 2.0
    failure_threshold: int = 3  # consecutive failures before a live worker is unhealthy
    start_deadline_s: float = 600.0  # readiness only: not ready after this long = failed


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One worker. ``env`` is the complete child environment (the supervisor adds only
    ``XPULAUNCH_JOB_ID`` and ``XPULAUNCH_WORKER``, the markers that find its descendants).
    ``prepare(attempt)`` is called before every start, ``attempt`` counting from 0, and
    returns the spec to start (for example with a new port after a failed bind)."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str | None = None
    pass_fds: tuple[int, ...] = ()
    readiness: Probe | None = None
    liveness: Probe | None = None
    prepare: Callable[[int], WorkerSpec] | None = None
