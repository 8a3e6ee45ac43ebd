"""Signal handlers that only post: the supervisor's loop does the work, since a handler may
interrupt code that holds a lock on the same thread.

Workers run in their own sessions, so the terminal's Ctrl-C (SIGINT to the foreground process
group), a hang-up or a ``kill`` reach only xpulaunch. The handler forwards the signal through
:meth:`Supervisor.send_stop_signal`: the first one goes to every worker's process group and
starts the grace period; a second one kills everything at once (torchrun stops on SIGTERM,
SIGINT and SIGHUP too). SIGUSR1 and SIGUSR2 are only passed on (:data:`RELAYED`, through
:meth:`Supervisor.send_signal`). Previous handlers are restored on exit.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import FrameType

T = TypeVar("T")

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
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
