"""Run the real ``xpulaunch`` CLI in a child process, as a user (or a hostile world) would."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

Launch = Callable[..., subprocess.Popen[bytes]]


def finish(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> tuple[int, str, str]:
    """Wait (bounded) for ``proc``; its status, stdout and stderr."""
    out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
