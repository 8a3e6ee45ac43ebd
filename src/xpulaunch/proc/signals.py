"""Signal handlers that only post: the supervisor's loop does the work (STYLE habit 4).

Workers run in their own sessions, so the terminal's Ctrl-C (SIGINT to the foreground process
group), a hang-up or a ``kill`` reach only xpulaunch. The handler forwards the signal through
:meth:`Supervisor.send_stop_signal`: the first one goes to every worker's process group and
starts the grace period; a second one kills everything at once (torchrun stops on SIGTERM,
SIGINT and SIGHUP too). Previous handlers are restored on exit.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import FrameType

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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
