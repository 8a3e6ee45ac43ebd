"""What the supervision options of ``xpulaunch run`` mean: :func:`options_from_kwargs` turns
the command's values (declared in :data:`xpulaunch.cli.run.SUPERVISOR_OPTIONS`) into
:class:`~xpulaunch.proc.launch.RunOptions`.

Names follow torchrun where it has one (``--max-restarts``, ``--log-dir``,
``--local-ranks-filter``) and docker for the restart mode (``--restart on-failure``).
``--max-restarts N`` alone means ``--restart on-failure``, as in torchrun. Importing this
module does not import the supervisor (``--dry-run`` stays light).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpulaunch.core.restart import RestartMode
from xpulaunch.errors import UsageError

if TYPE_CHECKING:  # the supervisor is imported only when a run really starts
    from collections.abc import Mapping
    from typing import Any

    from xpulaunch.proc.launch import RunOptions

DEFAULT_MAX_RESTARTS = 3


def options_from_kwargs(kwargs: Mapping[str, Any]) -> RunOptions:
    """Build :class:`RunOptions` from the command's keyword arguments (others are ignored)."""
    from xpulaunch.proc.launch import RunOptions

    max_restarts = kwargs.get("max_restarts")
    restart = kwargs.get("restart")
    if restart is None:
        restart = "on-failure" if max_restarts not in (None, 0) else "no"
    first_s, cap_s, factor = parse_backoff(str(kwargs.get("backoff") or "1:30:2"))
    grace_s = _seconds(kwargs.get("grace"), "--grace", 10.0)
    return RunOptions(
        restart=RestartMode(restart),
        max_restarts=_max_restarts(max_restarts),
        backoff_initial_s=first_s,
        backoff_max_s=cap_s,
        backoff_factor=factor,
        stable_window_s=_seconds(kwargs.get("stable_window"), "--stable-window", 60.0),
        grace_s=grace_s,
        gang=kwargs.get("gang"),
        log_dir=_log_dir(kwargs.get("log_dir")),
        console_ranks=parse_ranks(kwargs.get("ranks")),
        color=False if kwargs.get("no_color") else None,
    )


def _log_dir(value: str | None) -> str | None:
    """Create ``--log-dir`` now, so that a bad one fails before any device is leased."""
    if value is None:
        return None
    import os

    try:
        os.makedirs(value, exist_ok=True)
        if not os.access(value, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise UsageError(
            f"--log-dir {value}: cannot create or write it ({exc.strerror}); "
            "give a writable directory"
        ) from exc
    return value


def _max_restarts(value: int | None) -> int | None:
    if value is None:
        return DEFAULT_MAX_RESTARTS
    if value == -1:
        return None
    if value < 0:
        raise UsageError(f"--max-restarts {value}: expected a count >= 0, or -1 for no limit")
    return value


def _seconds(value: float | None, option: str, default: float) -> float:
    if value is None:
        return default
    seconds = float(value)
    if not seconds >= 0 or seconds == float("inf"):
        raise UsageError(f"{option} {value}: expected a number of seconds >= 0")
    return seconds


def parse_backoff(text: str) -> tuple[float, float, float]:
    """``FIRST[:MAX[:FACTOR]]`` -> (first_s, max_s, factor); ``0`` means no delay."""
    parts = text.split(":")
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        numbers = []
    if not 1 <= len(numbers) <= 3 or any(not n >= 0 or n == float("inf") for n in numbers):
        raise UsageError(
            f"--backoff {text!r}: expected FIRST[:MAX[:FACTOR]] in seconds, e.g. 1:30:2 or 0"
        )
    first_s = numbers[0]
    cap_s = numbers[1] if len(numbers) > 1 else max(30.0, first_s)
    factor = numbers[2] if len(numbers) > 2 else 2.0
    if cap_s < first_s:
        raise UsageError(f"--backoff {text!r}: the cap {cap_s:g} is below the first delay")
    if factor < 1:
        raise UsageError(f"--backoff {text!r}: the factor {factor:g} must be at least 1")
    return first_s, cap_s, factor


def parse_ranks(text: str | None) -> frozenset[str] | None:
    """``0,2`` -> {"0", "2"}; None or empty -> None (show every worker)."""
    if text is None or not text.strip():
        return None
    names = [t.strip() for t in text.split(",")]
    if any(not n for n in names):
        raise UsageError(f"--ranks {text!r}: expected a comma-separated list such as 0,2")
    return frozenset(names)
