"""What a worker process calls: ``xpulaunch.heartbeat()``, one line in a training loop.

Under ``xpulaunch run --hang-timeout S --heartbeat`` each worker gets
``XPULAUNCH_HEARTBEAT_FILE``; touching it tells the supervisor the worker still makes
progress, even when it prints nothing for a long time. Without that variable (the script runs
on its own, or without ``--heartbeat``) the call does nothing, so it can stay in the code.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from xpulaunch.model import HEARTBEAT_FILE_VAR

_MIN_INTERVAL_S = 1.0  # a loop calling it every step touches the file at most once a second
_last_beat_s = float("-inf")
_warned = False


def heartbeat() -> None:
    """Tell xpulaunch this worker is alive and making progress (cheap; call it often).

    It never raises: it runs inside the training loop, and a heartbeat file that cannot be
    touched (its directory removed, a read-only or full filesystem) must not end the run it
    watches. Such a failure is said once on stderr; xpulaunch then sees no beat, as if the
    worker were silent.
    """
    global _last_beat_s  # noqa: PLW0603 (one timestamp per process, on purpose)
    path = os.environ.get(HEARTBEAT_FILE_VAR)
    now = time.monotonic()
    if not path or now - _last_beat_s < _MIN_INTERVAL_S:
        return
    _last_beat_s = now
    try:
        try:
            os.utime(path)
        except FileNotFoundError:
            with open(path, "a"):  # removed meanwhile: create it, which sets its time too
                pass
    except OSError as exc:
        _warn_once(f"{path}: {exc.strerror or exc}")


def _warn_once(text: str) -> None:
    global _warned  # noqa: PLW0603 (one warning per process, on purpose)
    if _warned:
        return
    _warned = True
    with contextlib.suppress(OSError, ValueError, AttributeError):  # a closed stderr
        sys.stderr.write(f"xpulaunch: warning: heartbeat not recorded: {text}\n")
        sys.stderr.flush()
