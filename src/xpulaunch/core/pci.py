"""PCI address normalisation: every source spells a BDF differently (NVML's 8-digit domain, sysfs's
4, upper or lower case)."""

from __future__ import annotations

import re

_BDF = (
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
    r"(?P<dev>[0-9a-fA-F]{1,2})\.(?P<fn>[0-7])$"
)


def normalize_bus_id(text: str) -> str | None:
    """``00000000:00:06.0``, ``0000:C1:00.0`` or ``c1:00.0`` -> ``0000:c1:00.0``; else None.

    >>> normalize_bus_id("00000000:1A:00.0")
    '0000:1a:00.0'
    """
    match = re.match(_BDF, text.strip())
    if match is None:
        return None
    domain = int(match["domain"] or "0", 16) & 0xFFFF
    bus, dev, fn = int(match["bus"], 16), int(match["dev"], 16), int(match["fn"])
    if dev > 0x1F:
        return None
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"
