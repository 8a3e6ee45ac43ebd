"""Human units: sizes (``8GiB`` -> bytes and back) and UTC time stamps."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from xpulaunch.errors import UsageError

# Compiled by re on first use (and cached there), not at import: most launches parse no size.
_SIZE = r"(?i)^\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[kmgtpe]?i?b?)\s*$"
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}
_MAX_SIZE_CHARS = 40
MAX_SIZE_BYTES = 2**60


def parse_size(text: str) -> int:
    """``8GiB``/``8G`` -> 8 * 2**30; ``8GB`` -> 8 * 10**9; a bare number is bytes.

    >>> parse_size("1.5GiB")
    1610612736
    """
    match = re.match(_SIZE, text) if len(text) <= _MAX_SIZE_CHARS else None
    if match is None:
        shown = text if len(text) <= _MAX_SIZE_CHARS else text[:_MAX_SIZE_CHARS] + "..."
        raise UsageError(f"{shown!r} is not a size; use e.g. 8GiB, 512MiB or 8000000000")
    unit = match["unit"].lower()
    prefix = unit[:1] if unit[:1] in _POWERS and unit[:1] else ""
    binary = "i" in unit or unit in {"k", "m", "g", "t", "p", "e"}
    base = 1024 if binary else 1000
    size = float(match["num"]) * base ** _POWERS[prefix]
    if not size <= MAX_SIZE_BYTES:  # also inf: float("9" * 400)
        raise UsageError(f"{text.strip()!r} is larger than any device (at most 1 EiB)")
    return int(size)


def format_bytes(value: int | None) -> str:
    """``None`` -> ``?``; otherwise the largest binary unit with one decimal."""
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def iso_utc(wall_s: float) -> str:
    """``2026-11-23T23:32:13.123Z`` for ``wall_s`` seconds since the epoch (milliseconds, UTC):
    the one time stamp of log lines, events and run summaries."""
    stamp = datetime.fromtimestamp(wall_s, timezone.utc).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")
