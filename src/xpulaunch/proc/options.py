"""``supervisor_options``: the click options of ``xpulaunch run`` that shape supervision.

The CLI owns the command; this module owns what the supervisor's options mean::

    @click.command()
    @supervisor_options
    def run(**kwargs): ... run_plan(plan, dict(os.environ), options_from_kwargs(kwargs))

Names follow torchrun where it has one (``--max-restarts``, ``--log-dir``,
``--local-ranks-filter``) and docker for the restart mode (``--restart on-failure``).
``--max-restarts N`` alone means ``--restart on-failure``, as in torchrun. Importing this
module does not import the supervisor (``--dry-run`` stays light).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click

from xpulaunch.core.restart import RestartMode
from xpulaunch.errors import UsageError

if TYPE_CHECKING:  # the supervisor is imported only when a run really starts
    from xpulaunch.proc.launch import RunOptions

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_MAX_RESTARTS = 3

_OPTIONS = (
    click.option(
        "--restart",
        type=click.Choice([m.value for m in RestartMode]),
        envvar="XPULAUNCH_RESTART",
        help="When workers are started again. Default: no, or on-failure when "
        "--max-restarts is given.",
    ),
    click.option(
        "--max-restarts",
        type=int,
        envvar="XPULAUNCH_MAX_RESTARTS",
        metavar="N",
        help=f"Restarts allowed inside the stability window (-1: no limit; default "
        f"{DEFAULT_MAX_RESTARTS} with --restart).",
    ),
    click.option(
        "--backoff",
        default="1:30:2",
        show_default=True,
        envvar="XPULAUNCH_BACKOFF",
        metavar="FIRST[:MAX[:FACTOR]]",
        help="Seconds before the first restart, the cap, and the growth factor; 0 restarts "
        "at once.",
    ),
    click.option(
        "--stable-window",
        type=float,
        default=60.0,
        show_default=True,
        envvar="XPULAUNCH_STABLE_WINDOW",
        metavar="SECONDS",
        help="A run that lasted this long resets the restart count.",
    ),
    click.option(
        "--gang/--no-gang",
        default=None,
        help="Restart all workers when one fails (default without --isolate) or each on "
        "its own (default with --isolate).",
    ),
    click.option(
        "--grace",
        type=float,
        default=10.0,
        show_default=True,
        envvar="XPULAUNCH_GRACE",
        metavar="SECONDS",
        help="After the stop signal, wait this long before SIGKILL.",
    ),
    click.option(
        "--log-dir",
        type=click.Path(file_okay=False),
        envvar="XPULAUNCH_LOG_DIR",
        help="Write DIR/attempt_N/WORKER.log for every worker and attempt.",
    ),
    click.option(
        "--ranks",
        "--local-ranks-filter",
        "ranks",
        metavar="LIST",
        help="Show only these workers on the console, e.g. 0,2 (log files keep all).",
    ),
    click.option(
        "--no-color",
        is_flag=True,
        help="No colour in worker prefixes (also NO_COLOR=1).",
    ),
)


def supervisor_options(command: F) -> F:
    """Add the supervisor's options to a click command."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


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
