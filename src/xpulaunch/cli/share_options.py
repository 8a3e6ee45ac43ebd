"""``--slots-per-gpu K`` and ``--gpu-memory SIZE``: a small job that shares its devices.

Wiring, in a command decorated with :func:`share_options`::

    share = pop_share(options)                  # removes the two keys; None: devices alone
    plan = api.plan(..., share=share)           # the share in the plan and XPULAUNCH_MAX_MEMORY
    settings.allocate(plan_fn, share=share)     # a slot of each device instead of all of it
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from xpulaunch.cli.options import option_group
from xpulaunch.core.slots import MAX_SLOTS
from xpulaunch.core.units import parse_size
from xpulaunch.errors import UsageError
from xpulaunch.model import DeviceShare

if TYPE_CHECKING:
    from collections.abc import MutableMapping
    from typing import Any

share_options = option_group(
    click.option(
        "--slots-per-gpu",
        type=click.IntRange(1, MAX_SLOTS),
        envvar="XPULAUNCH_SLOTS_PER_GPU",
        metavar="K",
        help="Share each device with other small jobs, at most K on it; this job's share "
        "(XPULAUNCH_MAX_MEMORY) is 1/K of its memory [env: XPULAUNCH_SLOTS_PER_GPU].",
    ),
    click.option(
        "--gpu-memory",
        envvar="XPULAUNCH_GPU_MEMORY",
        metavar="SIZE",
        help="Share each device with other small jobs while their budgets fit its memory; "
        "this job's budget on each (e.g. 10GiB) [env: XPULAUNCH_GPU_MEMORY].",
    ),
)


def pop_share(options: MutableMapping[str, Any]) -> DeviceShare | None:
    """Take the two options out of a command's keyword arguments; None unless one asks to
    share (K = 1 alone is a device to oneself: the ordinary lease)."""
    slots = options.pop("slots_per_gpu", None)
    memory = options.pop("gpu_memory", None)
    memory_bytes = None if memory is None else parse_size(str(memory), option="--gpu-memory")
    if memory_bytes == 0:
        raise UsageError("--gpu-memory 0: a budget must be more than 0 bytes")
    if memory_bytes is None and (slots is None or slots == 1):
        return None
    return DeviceShare(slots=slots if slots and slots > 1 else None, memory_bytes=memory_bytes)
