"""Slot leases: several small jobs on one device (``--slots-per-gpu``, ``--gpu-memory``).

A job that shares a device holds two locks on it instead of one:

* a *shared* ``flock`` (``LOCK_SH``) on the unit's ordinary lock file ``unit-<key>.lock``: any
  number of sharing jobs hold it together, while a job that wants the device alone
  (``LOCK_EX``) cannot take it, and a job holding it alone keeps every sharing job out. So
  launches that know nothing of slots already see a shared device as leased;
* an exclusive ``flock`` on one slot file ``slot-<key>.<n>.lock`` (the lowest free ``n``),
  with a side file ``slot-<key>.<n>.holder`` saying who holds it and what share it asked for
  (its K, its memory budget, and the device's memory as its plan saw it).

The descriptors pass to the workers and the guardian like any lease's, so the slot ends with
the last process of the job. Every probe and lock happens under the directory's allocation
lock; a slot whose lock can be taken is free, whatever its side file says (the kernel's lock
is the truth, as for whole-device leases). Whether one more job fits is decided by
:func:`xpulaunch.core.slots.room_for`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpulaunch.errors import DeviceBusyError
from xpulaunch.leases.lock_directory import LockDirectory
from xpulaunch.leases.lock_files import (
    LOCK_SUFFIX,
    UNIT_PREFIX,
    HolderInfo,
    lock_file_name,
)
from xpulaunch.model import MAX_SLOTS, DeviceShare, Plan

if TYPE_CHECKING:
    from xpulaunch.core.slots import SlotHolder

SLOT_PREFIX = "slot-"
_HOLDER = ".holder"


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """A live slot lease, as ``xpulaunch status`` and ``top`` show it."""

    key: str
    slot: int
    share: DeviceShare
    total_bytes: int | None  # the device's memory, as the holder's plan saw it
    holder: HolderInfo | None  # None: its side file is missing or unreadable

    def as_holder(self) -> SlotHolder:
        from xpulaunch.core.slots import SlotHolder

        who = self.holder.describe() if self.holder else "a job whose record is missing"
        return SlotHolder(self.share, who)


def unavailable(
    directory: LockDirectory, described: Mapping[str, str], share: DeviceShare | None
) -> dict[str, str]:
    """The planner's ``unavailable`` for a job asking for ``share`` (None: devices alone).

    ``described`` maps every leased unit key to its holder, as whole-device leases describe
    it; a unit shared by slot jobs is described by them instead, and left out when the job
    may join them. Under the allocation lock."""
    return left_for(share, described, sharers_by_key(directory, described))


def sharers_by_key(directory: LockDirectory, keys: Iterable[str]) -> dict[str, list[SlotRecord]]:
    """The slot holders of each of the leased ``keys`` that slot jobs share (those held
    whole by one job are left out). Under the allocation lock."""
    found = ((key, _sharers_if_shared(directory, key)) for key in keys)
    return {key: sharers for key, sharers in found if sharers is not None}


def left_for(
    share: DeviceShare | None,
    described: Mapping[str, str],
    sharers: Mapping[str, Sequence[SlotRecord]],
) -> dict[str, str]:
    """``described``, with each shared unit said by its sharers instead, or left out when a
    job asking for ``share`` fits beside them (none left: free). Pure."""
    result = dict(described)
    for key, holders in sharers.items():
        from xpulaunch.core.slots import room_for  # here: most hosts have no slot job

        total = next((s.total_bytes for s in holders if s.total_bytes is not None), None)
        why = room_for(share, [s.as_holder() for s in holders], total)
        if why is None:
            result.pop(key, None)
        else:
            result[key] = why
    return result


def shared_keys(directory: LockDirectory, keys: Sequence[str]) -> set[str]:
    """Which of the leased ``keys`` are held by slot jobs (not by one job alone)."""
    return {key for key in keys if _sharers_if_shared(directory, key) is not None}


def records(directory: LockDirectory) -> list[SlotRecord]:
    """Every live slot lease of the directory, by key and slot. Under the allocation lock."""
    probed = (_probe(directory, n) for n in sorted(directory.names(SLOT_PREFIX, LOCK_SUFFIX)))
    return sorted((r for r in probed if r is not None), key=lambda r: (r.key, r.slot))


def lock(directory: LockDirectory, plan: Plan, holder: HolderInfo) -> tuple[int, ...]:
    """Take one slot of each of the plan's units (shared unit lock, exclusive slot lock) and
    write who holds it; the descriptors, two per unit. Under the allocation lock."""
    share = plan.share or DeviceShare()
    with ExitStack() as undo:
        fds: list[int] = []
        for unit in plan.devices:
            key = unit.key
            unit_fd = directory.must_open(lock_file_name(key), os.O_RDONLY)
            undo.callback(os.close, unit_fd)
            if not directory.try_lock(unit_fd, shared=True):
                raise DeviceBusyError(
                    f"{unit.label()} was leased whole by another job while this launch was "
                    "planning; try again, or wait with --wait"
                )
            slot, slot_fd = _free_slot(directory, key)
            undo.callback(os.close, slot_fd)
            record = {
                "key": key,
                "slot": slot,
                "slots": share.slots,
                "memory_bytes": share.memory_bytes,
                "total_bytes": unit.memory_total_bytes,
                **holder.to_dict(),
            }
            directory.write(_slot_name(key, slot) + _HOLDER, record)
            fds += [unit_fd, slot_fd]
        undo.pop_all()
    return tuple(fds)


def _free_slot(directory: LockDirectory, key: str) -> tuple[int, int]:
    for slot in range(MAX_SLOTS):
        fd = directory.must_open(_slot_name(key, slot) + LOCK_SUFFIX, os.O_RDONLY)
        if directory.try_lock(fd):
            return slot, fd
        os.close(fd)
    raise DeviceBusyError(f"{key}: all {MAX_SLOTS} slots are taken")


def _sharers_if_shared(directory: LockDirectory, key: str) -> list[SlotRecord] | None:
    """The slot holders of a leased unit, or None when one job holds it alone."""
    fd = directory.open_file(lock_file_name(key), os.O_RDONLY, create=False, writable_by_all=True)
    if fd is None:
        return None
    try:
        if not directory.try_lock(fd, shared=True):
            return None  # an exclusive holder keeps even a shared lock out
    finally:
        os.close(fd)  # drops the probe's own shared lock
    prefix = _slot_name(key, None)
    names = directory.names(prefix, LOCK_SUFFIX)  # a longer key's slots too: not a number
    numbered = sorted(n for n in names if n[len(prefix) : -len(LOCK_SUFFIX)].isdigit())
    return [r for r in (_probe(directory, n) for n in numbered) if r is not None]


def _probe(directory: LockDirectory, name: str) -> SlotRecord | None:
    """The record of a held slot lock file; None when the slot is free."""
    if not directory.is_held(name):
        return None
    data = directory.read(name[: -len(LOCK_SUFFIX)] + _HOLDER) or {}
    key, slot = data.get("key"), data.get("slot")
    return SlotRecord(
        key=key if isinstance(key, str) else name,
        slot=slot if isinstance(slot, int) else -1,
        share=DeviceShare(_int(data.get("slots")), _int(data.get("memory_bytes"))),
        total_bytes=_int(data.get("total_bytes")),
        holder=HolderInfo.from_dict(data),
    )


def _slot_name(key: str, slot: int | None) -> str:
    """``slot-<escaped key>.<n>`` (no suffix); with ``slot=None`` the prefix of them all."""
    stem = lock_file_name(key)[len(UNIT_PREFIX) : -len(LOCK_SUFFIX)]
    return f"{SLOT_PREFIX}{stem}." + ("" if slot is None else str(slot))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
