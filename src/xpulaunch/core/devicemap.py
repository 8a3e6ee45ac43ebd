"""Device maps and memory budgets for a single process spanning several devices.

The names are accelerate's (``sequential``, ``balanced``, ``balanced_low_0``). Budgets follow
accelerate's own default of keeping ~10% headroom on each GPU (``get_balanced_memory`` caps at
90%), computed here from the probe instead of from a CUDA context on every device.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from xpulaunch.model import DeviceMap, Unit

if TYPE_CHECKING:
    from collections.abc import Sequence

HEADROOM_FRACTION = 0.10


def choose_device_map(units: int, requested: DeviceMap | None) -> DeviceMap | None:
    """``sequential`` for one device, ``balanced`` for several, the request when given."""
    if units == 0:
        return None
    if requested is not None:
        return requested
    return DeviceMap.SEQUENTIAL if units == 1 else DeviceMap.BALANCED


def max_memory(units: Sequence[Unit]) -> dict[str, int]:
    """accelerate ``max_memory`` keyed by the child's ordinals: ``{"0": bytes, ...}``.

    Uses known free memory, else the total; a device with neither is left out (accelerate then
    measures it itself).
    """
    budget: dict[str, int] = {}
    for ordinal, unit in enumerate(units):
        base = unit.memory_free_bytes
        if base is None:
            base = unit.memory_total_bytes
        if base is not None:
            budget[str(ordinal)] = int(base * (1 - HEADROOM_FRACTION))
    return budget


def max_memory_json(units: Sequence[Unit]) -> str:
    return json.dumps(max_memory(units), separators=(",", ":"))
