"""Signalling process groups and whole process trees, safely.

Every worker runs in its own session, so its pid is also its process-group id and session
id. Stopping a worker follows the usual discipline (torch ``PContext.close``,
llama-swap ``killProcess``):

1. Send the stop signal to the worker's whole group, and to every process of the worker that
   left the group (``setsid`` grandchildren, found by session id and the environment marker
   in :func:`xpulaunch.processes.procfs.find_job`).
2. Wait, bounded by a monotonic deadline (the supervisor loop does this without blocking).
3. SIGKILL the group and every process of the worker that is still there.

"Already gone" is success at every step. We never signal pid 0, 1 or -1 (``killpg(1)`` is
``kill(-1)``: every process we may signal; Unsloth #8797), nor our own process group (a
``killpg(getpgid(pid))`` taken before the child ran ``setsid`` hits the supervisor itself;
apache/airflow PR #65738 review).
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpulaunch.processes.procfs import JobProcess


def _is_safe_target(pid: int) -> bool:
    return pid > 1 and pid != os.getpid()


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group no longer exists."""
    if not _is_safe_target(pgid) or pgid == os.getpgrp():
        return False
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # every member already gone
        return False
    except PermissionError:
        # A member changed its credentials (setuid exec); the others were still signalled
        # only if the kernel got that far, so report the group as alive and let the caller
        # fall back to per-process signals.
        return True
    return True


def signal_pid(pid: int, sig: int) -> bool:
    """Send ``sig`` to one process; False when it is gone (or not ours to signal)."""
    if not _is_safe_target(pid):
        return False
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):  # gone, or the pid now belongs to others
        return False
    return True


def signal_processes(processes: Iterable[JobProcess], sig: int) -> int:
    """Signal each process found by :func:`find_job`; returns how many were signalled."""
    return sum(signal_pid(p.info.pid, sig) for p in processes)


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


def exit_status(returncode: int) -> int:
    """A shell-style exit status: the exit code, or 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal without a name
        return f"signal {signum}"


def describe_returncode(returncode: int) -> str:
    """``exit code 3`` or ``killed by SIGSEGV (exit status 139)``."""
    if returncode < 0:
        return f"killed by {signal_name(-returncode)} (exit status {128 - returncode})"
    return f"exit code {returncode}"
