"""What the supervision options of ``xpulaunch run`` mean: parsers of the command's values
(declared in :mod:`xpulaunch.cli.run`), used by
:meth:`~xpulaunch.launch.run.RunOptions.from_cli` and by the plan.

Names follow torchrun where it has one (``--max-restarts``, ``--log-dir``,
``--local-ranks-filter``) and docker for the restart mode (``--restart on-failure``).
``--max-restarts N`` alone means ``--restart on-failure``, as in torchrun. This module does
not import the supervisor: ``--dry-run`` needs :func:`plan_restart_limit` only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from xpulaunch.core.restart import RestartMode
from xpulaunch.errors import UsageError

DEFAULT_MAX_RESTARTS = 3
DEFAULT_BACKOFF = "1:30:2"
MIN_METRICS_INTERVAL_S = 0.1


def restart_settings(values: Mapping[str, Any]) -> tuple[RestartMode, int | None]:
    """``--restart`` and ``--max-restarts`` -> (mode, max restarts; None: no limit)."""
    max_restarts = values.get("max_restarts")
    restart = values.get("restart")
    if restart is None:
        restart = "on-failure" if max_restarts not in (None, 0) else "no"
    if restart == "always" and max_restarts is None:
        return RestartMode.ALWAYS, None  # docker's meaning: always, unless a limit is given
    return RestartMode(restart), _max_restarts(max_restarts)


def restart_limit(mode: RestartMode, max_restarts: int | None) -> int | None:
    """How many restarts a worker may see (``TORCHELASTIC_MAX_RESTARTS``): 0 when restarts
    are off, None when there is no limit."""
    return 0 if mode is RestartMode.NO else max_restarts


def plan_restart_limit(values: Mapping[str, Any]) -> int | None:
    """:func:`restart_limit` of the command's values, for the plan (a dry run too)."""
    return restart_limit(*restart_settings(values))


def check_run_values(values: Mapping[str, Any]) -> None:
    """Every check of the supervision options that a real run makes (through
    :meth:`~xpulaunch.launch.run.RunOptions.from_cli`), without its side effects: a dry run
    accepts exactly what a real run accepts."""
    restart_settings(values)
    parse_backoff(str(values.get("backoff") or DEFAULT_BACKOFF))
    parse_seconds(values.get("stable_window"), "--stable-window", 60.0)
    parse_seconds(values.get("grace"), "--grace", 10.0)
    parse_ranks(values.get("ranks"))


def make_log_dir(value: str | None) -> str | None:
    """Create ``--log-dir`` at once, so that a bad one fails before any device is leased."""
    if value is None:
        return None
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


def parse_seconds(value: float | None, option: str, default: float) -> float:
    """A duration option: ``default`` when not given; a finite number of seconds >= 0."""
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


def operations_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """``--hang-timeout``, ``--heartbeat``, ``--max-runtime``, ``--events`` and the
    ``--metrics-*`` options -> the matching :class:`~xpulaunch.launch.run.RunOptions` fields
    (only those given)."""
    settings: dict[str, Any] = {}
    for option, field in (("hang_timeout", "hang_timeout_s"), ("max_runtime", "max_runtime_s")):
        if values.get(option) is not None:
            settings[field] = _positive_seconds(values[option], "--" + option.replace("_", "-"))
    if values.get("heartbeat"):
        if "hang_timeout_s" not in settings:
            raise UsageError("--heartbeat needs --hang-timeout SECONDS (how long without a beat)")
        settings["heartbeat"] = True
    if values.get("events"):
        settings["events"] = str(values["events"])
    if values.get("metrics_port") is not None:
        settings["metrics_port"] = int(values["metrics_port"])
        settings["metrics_host"] = str(values.get("metrics_host") or "127.0.0.1")
        interval = values.get("metrics_interval")
        interval = 10.0 if interval is None else interval
        settings["metrics_interval_s"] = _positive_seconds(interval, "--metrics-interval")
        if settings["metrics_interval_s"] < MIN_METRICS_INTERVAL_S:
            # Each interval probes every device again; faster keeps a core busy for nothing
            # (Prometheus scrapes every 15 s by default).
            raise UsageError(
                f"--metrics-interval {interval}: expected at least {MIN_METRICS_INTERVAL_S:g} "
                "seconds"
            )
    return settings


def _positive_seconds(value: float, option: str) -> float:
    seconds = float(value)
    if not 0 < seconds < float("inf"):
        raise UsageError(f"{option} {value}: expected a number of seconds > 0")
    return seconds
