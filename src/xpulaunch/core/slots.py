"""Several small jobs on one device (``--slots-per-gpu K``, ``--gpu-memory SIZE``): may one
more join the jobs already there? Pure.

A sharing job takes one *slot* of each of its devices; a device holds slot jobs until
either limit is reached: the smallest K that any of them (or the newcomer) asked for, or the
device's memory, each job counting ``--gpu-memory`` or, with only K, ``total / K``. A job that
does not share needs its devices alone, so a device with any slot job is leased for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpulaunch.core.units import format_bytes
from xpulaunch.model import MAX_SLOTS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from xpulaunch.model import DeviceShare, Unit

__all__ = ["MAX_SLOTS", "SlotHolder", "describe_share", "room_for", "unit_rejection"]


@dataclass(frozen=True, slots=True)
class SlotHolder:
    """A job holding one slot of a device, and who it is (for messages)."""

    share: DeviceShare
    who: str


def room_for(
    share: DeviceShare | None, holders: Sequence[SlotHolder], total_bytes: int | None
) -> str | None:
    """None when a job asking for ``share`` (None: the device alone) may join ``holders`` on
    a device with ``total_bytes`` of memory; else why not, worded to follow "leased by"."""
    if not holders:
        return None
    sharing = f"{len(holders)} job{'s' if len(holders) != 1 else ''} sharing it"
    if share is None:
        return f"{sharing} ({_who(holders)})"
    limits = [k for k in (share.slots, *(h.share.slots for h in holders)) if k]
    if limits and len(holders) + 1 > min(limits):
        return f"{sharing}, all {min(limits)} slots taken ({_who(holders)})"
    if len(holders) + 1 > MAX_SLOTS:
        return f"{sharing}, the most one device holds ({_who(holders)})"
    budgets = share.memory_bytes is not None or any(h.share.memory_bytes for h in holders)
    if not budgets:
        return None
    if total_bytes is None:
        return f"{sharing}, and its memory is unknown so --gpu-memory cannot be checked"
    promised = sum(h.share.claim_bytes(total_bytes) or 0 for h in holders)
    mine = share.claim_bytes(total_bytes) or 0
    if promised + mine > total_bytes:
        return (
            f"{sharing} with {format_bytes(promised)} of its {format_bytes(total_bytes)} "
            f"promised, no room for {format_bytes(mine)} more ({_who(holders)})"
        )
    return None


def unit_rejection(unit: Unit, share: DeviceShare) -> str | None:
    """Why a sharing job cannot use ``unit`` at all, whoever else is on it; None if it can.

    Sharing replaces the "busy" test of whole-device jobs (other jobs' memory on a shared
    device is the point) with: this job's share fits in the memory known to be free.
    """
    total = unit.memory_total_bytes
    claim = share.claim_bytes(total)
    if share.memory_bytes is not None and total is not None and share.memory_bytes > total:
        return f"--gpu-memory {format_bytes(share.memory_bytes)} > its {format_bytes(total)}"
    free = unit.memory_free_bytes
    if claim is not None and free is not None and free < claim:
        return f"{format_bytes(free)} free < this job's share of {format_bytes(claim)}"
    return None


def describe_share(share: DeviceShare) -> str:
    """``--slots-per-gpu 2`` / ``--gpu-memory 10.0 GiB`` / both, for notes."""
    parts = []
    if share.slots:
        parts.append(f"--slots-per-gpu {share.slots}")
    if share.memory_bytes is not None:
        parts.append(f"--gpu-memory {format_bytes(share.memory_bytes)}")
    return ", ".join(parts)


def _who(holders: Sequence[SlotHolder]) -> str:
    return "; ".join(h.who for h in holders)
