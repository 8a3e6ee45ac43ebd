"""Signals, both ways: sent to a worker's process group and its whole tree, safely; and
received by xpulaunch, whose handlers only post.

Sent. Every worker runs in its own session, so its pid is also its process-group id and session
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

Received. A handler only posts: the supervisor's loop does the work, since a handler may
interrupt code that holds a lock on the same thread. Workers run in their own sessions, so the
terminal's Ctrl-C (SIGINT to the foreground process group), a hang-up or a ``kill`` reach only
xpulaunch. The handler forwards the signal through :meth:`Supervisor.send_stop_signal`: the
first one goes to every worker's process group and starts the grace period; a second one kills
everything at once (torchrun stops on SIGTERM, SIGINT, SIGHUP and SIGQUIT too). SIGUSR1 and
SIGUSR2 are only passed on (:data:`RELAYED`, through :meth:`Supervisor.send_signal`). Previous
handlers are restored on exit.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from types import FrameType

    from xpulaunch.processes.procfs import JobProcess

T = TypeVar("T")

# SIGQUIT too (the terminal's Ctrl-\): torchrun's agent stops its workers on it, and left to
# its default action it would kill xpulaunch at once, its workers then SIGKILLed by their
# parent-death signal with no grace and no word of why.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# Sent on to the workers without stopping anything: Slurm's warning before it preempts or
# ends a job (sbatch --signal), which a training script answers with a checkpoint. Left to
# their default action they would kill xpulaunch (and with it the job) instead.
RELAYED = (signal.SIGUSR1, signal.SIGUSR2)
# How long a forwarded signal may wait for its handler when the kernel gave it to another
# thread than the main one (see wait_answering).
HANDLER_DELAY_S = 0.5


@contextmanager
def forwarding(
    on_signal: Callable[[int], None], signals: tuple[signal.Signals, ...] = FORWARDED
) -> Iterator[None]:
    """Install handlers calling ``on_signal(signum)`` while the block runs.

    Python runs handlers only on the main thread; from any other thread nothing is installed
    and the caller's own handling stays in place.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        on_signal(signum)

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def wait_answering(
    wait: Callable[[float | None], T | None], timeout: float | None = None
) -> T | None:
    """``wait(timeout)`` in slices of at most :data:`HANDLER_DELAY_S`: what it returns first
    that is not None, or None once ``timeout`` (None: no limit) has passed.

    The kernel hands a signal sent to the process to any of its threads that does not block
    it, and Python runs the handler on the main thread only, once that thread runs Python
    code again; a wait on a lock without a timeout never returns for it. (On a loaded
    two-core machine the supervisor's loop thread now and then took a SIGTERM, and the job
    ran on, restarting its failing worker.) Waiting in slices bounds that delay, whichever
    thread took the signal, ours or a library's."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = HANDLER_DELAY_S if deadline is None else deadline - time.monotonic()
        result = wait(max(0.0, min(left, HANDLER_DELAY_S)))
        if result is not None or (deadline is not None and time.monotonic() >= deadline):
            return result


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
