"""``--gpus`` parsing and device selection: which units a job gets, and why.

Pure. The input is the parent's visible units (core.visibility), the user's request and who
holds what (leases); the output is the chosen units plus a note for every choice and rejection.

Did a scheduler allocate this job its GPUs (:func:`allocated_by`)? Then ``--gpus auto`` takes
all of them. On a shared workstation ``auto`` skips a busy GPU: someone else is using it.
Under a scheduler that gave the job its GPUs, a busy one is this job's own (a leftover of its
last step, a monitoring agent), and skipping it shrinks the job silently: with
``--nproc-per-node auto`` one node then runs fewer workers than the others. So there ``auto``
takes every GPU the job can see and warns about a busy one.

- Slurm's gres plugin sets ``SLURM_STEP_GPUS`` (in a step) or ``SLURM_JOB_GPUS`` (in the
  batch script) and the vendor's mask (``CUDA_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES``,
  ``ZE_AFFINITY_MASK``); a mask set inside a Slurm job counts too.
- Kubernetes' NVIDIA device plugin hands the container its GPUs through
  ``NVIDIA_VISIBLE_DEVICES`` (UUIDs or indices; ``all``, ``none``, ``void`` are not a
  request), in a pod (``KUBERNETES_SERVICE_HOST``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from xpulaunch.core.device_ids import normalize_bus_id, resolve_ids, split_vendor, uuid_prefix_names
from xpulaunch.core.units import format_bytes
from xpulaunch.errors import DeviceBusyError, SelectionError, UsageError, member_of
from xpulaunch.model import Device, DeviceShare, Unit

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# Re-exported: callers ask selection for the id helpers they used to find here.
__all__ = [
    "BUSY_MEMORY_FRACTION",
    "BUSY_UTILIZATION_PERCENT",
    "UNKNOWN_FREE_POLICY",
    "Filters",
    "GpuMode",
    "GpuRequest",
    "Selection",
    "busy_reason",
    "holder_of",
    "parse_gpus",
    "resolve_ids",
    "select",
    "split_vendor",
    "uuid_prefix_names",
]

# A device is "busy" (not free for auto/N) above these readings. A CUDA context alone costs
# ~0.5 GiB, so 10% of an 8 GiB card still counts as idle.
BUSY_MEMORY_FRACTION = 0.10
BUSY_UTILIZATION_PERCENT = 50.0

_VALID = (
    "auto, all, none, a count like 2, or device ids like 0,2 / device=GPU-... / 0000:29:00.0 "
    "/ nvidia:0 / intel:0.1"
)
# Patterns that re compiles on first use (and caches): only --gpus with device ids needs them.
_TILE = r"^\d+\.\d+$"
_UUIDISH = r"^(GPU-|MIG-)?[0-9a-fA-F]{8}(-?[0-9a-fA-F]{4,})*$"


class GpuMode(str, Enum):
    AUTO = "auto"
    ALL = "all"
    NONE = "none"
    COUNT = "count"
    EXPLICIT = "explicit"


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """A parsed ``--gpus`` value."""

    mode: GpuMode
    count: int = 0  # COUNT: exactly this many; AUTO: at most this many (0: no limit)
    ids: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        if self.mode is GpuMode.COUNT:
            return str(self.count)
        if self.mode is GpuMode.EXPLICIT:
            return "device=" + ",".join(self.ids)
        return str(self.mode.value)


@dataclass(frozen=True, slots=True)
class Filters:
    """User filters for auto/N selection. ``None`` = no constraint."""

    min_free_memory_bytes: int | None = None
    max_utilization_percent: float | None = None
    # A job sharing its devices: its share must fit in the free memory, and the "busy" test
    # does not apply (see xpulaunch.core.slots).
    share: DeviceShare | None = None
    # --topology prefer|require|ignore: how N devices are chosen among the free ones
    # (xpulaunch.core.topology).
    topology: str = "prefer"


@dataclass(frozen=True, slots=True)
class Selection:
    units: tuple[Unit, ...]
    notes: tuple[str, ...] = field(default=())


MAX_GPUS_CHARS = 4096  # room for 64 device UUIDs with their commas


def parse_gpus(text: str) -> GpuRequest:
    """Parse ``--gpus`` the way ``docker run --gpus`` splits counts from lists.

    >>> parse_gpus("0,2").ids
    ('0', '2')
    """
    value = text.strip()
    if len(value) > MAX_GPUS_CHARS:
        raise UsageError(
            f"{len(value)} characters; expected at most {MAX_GPUS_CHARS}",
            option="gpus",
            value=value[:40] + "...",
        )
    lowered = value.lower()
    if lowered in ("auto", "all", "none"):
        return GpuRequest(GpuMode(lowered))
    if lowered.startswith("device="):
        return GpuRequest(GpuMode.EXPLICIT, ids=_split_ids(value[len("device=") :], text))
    if "," in value:
        return GpuRequest(GpuMode.EXPLICIT, ids=_split_ids(value, text))
    if value.isascii() and value.isdigit():
        count = int(value)
        if count == 0:
            raise UsageError(
                "a count (as in docker run --gpus) must be at least 1; for the device with index 0 "
                "write device=0, for the CPU none",
                option="gpus",
                value=text,
            )
        return GpuRequest(GpuMode.COUNT, count=count)
    _, bare = split_vendor(value)
    named = normalize_bus_id(bare) is not None or re.match(_UUIDISH, bare) or re.match(_TILE, bare)
    # A PCI address, a UUID, CARD.TILE, or vendor:N (nvidia:0 is an id, not a count).
    if named or (bare != value and bare.isascii() and bare.isdigit()):
        return GpuRequest(GpuMode.EXPLICIT, ids=(value,))
    raise UsageError(f"expected {_VALID}", option="gpus", value=text, malformed=True)


def _split_ids(body: str, text: str) -> tuple[str, ...]:
    ids = tuple(part.strip() for part in body.split(","))
    if not ids or any(not part for part in ids):
        raise UsageError(
            f"empty device id in the list; expected {_VALID}",
            option="gpus",
            value=text,
            malformed=True,
        )
    if len(set(ids)) != len(ids):
        raise UsageError("a device is listed twice", option="gpus", value=text, malformed=True)
    return ids


def select(
    request: GpuRequest,
    units: Sequence[Unit],
    devices: Sequence[Device],
    *,
    filters: Filters = Filters(),
    unavailable: Mapping[str, str] | None = None,
    elsewhere: str = "",
) -> Selection:
    """Choose units for ``request`` among the parent's visible ``units``.

    ``elsewhere`` tells a user whose count cannot be met about other vendors' GPUs.
    """
    held = unavailable or {}
    if request.mode is GpuMode.NONE:
        return Selection((), ("--gpus none: running on the CPU",))
    if request.mode is GpuMode.EXPLICIT:
        chosen = resolve_ids(request.ids, units, devices, elsewhere=elsewhere)
        _refuse_held(chosen, held)
        return Selection(
            chosen, tuple(f"{u.label()}: named explicitly" + _busy_suffix(u) for u in chosen)
        )
    if request.mode is GpuMode.ALL:
        chosen = tuple(u for u in units if not u.device.integrated)
        _refuse_held(chosen, held)
        notes = [f"{u.label()}: --gpus all" + _busy_suffix(u) for u in chosen]
        notes += [
            f"{u.label()}: skipped, integrated GPUs are only used when named explicitly"
            for u in units
            if u.device.integrated
        ]
        return Selection(chosen, tuple(notes))
    return _select_free(request, units, filters, held, elsewhere)


def _select_free(
    request: GpuRequest,
    units: Sequence[Unit],
    filters: Filters,
    held: Mapping[str, str],
    elsewhere: str,
) -> Selection:
    rejections = [(unit, _rejection(unit, filters, held)) for unit in units]
    notes = [f"{unit.label()}: skipped, {why}" for unit, why in rejections if why is not None]
    eligible = sorted((unit for unit, why in rejections if why is None), key=_rank)
    if request.mode is GpuMode.COUNT:
        if len(eligible) < request.count:
            why = "; ".join(notes) or ("all of them free" if units else "none is visible")
            why += f"; {elsewhere}" if elsewhere else ""
            raise SelectionError(
                f"only {len(eligible)} free device(s) of {len(units)} visible ({why})",
                option="gpus",
                value=request.text,
            )
        eligible, topology_notes = _by_topology(eligible, request.count, filters, units)
    elif request.count and len(eligible) > request.count:  # auto, with one device per worker
        free = eligible
        eligible, topology_notes = _by_topology(free, request.count, filters, units)
        left = ", ".join(u.label() for u in physical_order([u for u in free if u not in eligible]))
        notes.append(
            f"{left}: free, left to other jobs: {request.count} workers use one device each "
            "(--nproc-per-node auto: one worker per free device)"
        )
    else:
        topology_notes = ()
    notes += [f"{unit.label()}: chosen, {_describe_free(unit)}" for unit in eligible]
    if any(u.memory_free_bytes is None for u in eligible):
        notes.append(UNKNOWN_FREE_POLICY)
    notes += topology_notes
    chosen = physical_order(eligible)
    if len(chosen) > 1 and chosen != tuple(eligible):
        notes.append(PHYSICAL_ORDER_NOTE)
    return Selection(chosen, tuple(notes))


def _by_topology(
    ranked: list[Unit], count: int, filters: Filters, units: Sequence[Unit]
) -> tuple[list[Unit], tuple[str, ...]]:
    """``count`` of the free ``ranked`` units, as ``--topology`` picks them (its notes)."""
    if count < 2 or filters.topology == "ignore":
        return ranked[:count], ()
    from xpulaunch.core.topology import TopologyMode, choose

    picked = choose(ranked, count, member_of(TopologyMode, "topology", filters.topology), units)
    chosen = set(picked.units)
    return [u for u in ranked if u in chosen], picked.notes


# Chosen by free memory, handed out by index: in free-memory order rank 0 landed on another
# GPU from run to run, which changes NCCL's ring (and so the bits of a result) and breaks a
# user's CPU/NUMA pinning by LOCAL_RANK.
PHYSICAL_ORDER_NOTE = (
    "the chosen devices are handed out in index order (LOCAL_RANK 0 gets the lowest), as "
    "--gpus all does, whatever order they were chosen in"
)


def physical_order(units: Sequence[Unit]) -> tuple[Unit, ...]:
    """``units`` in the inventory's index order (tiles of a card, and a card's MIG
    instances, keep their order)."""
    return tuple(sorted(units, key=lambda u: (u.device.index, u.tile or 0)))


def _rejection(unit: Unit, filters: Filters, held: Mapping[str, str]) -> str | None:
    holder = holder_of(unit, held)
    if holder is not None:
        return f"leased by {holder}"
    if unit.device.integrated:
        return "integrated GPUs are only used when named explicitly"
    free, total = unit.memory_free_bytes, unit.memory_total_bytes
    minimum = filters.min_free_memory_bytes
    if minimum is not None:
        need = format_bytes(minimum)
        if free is None and total is not None and total < minimum:
            return f"only {format_bytes(total)} in all < the {need} minimum asked for"
        if free is not None and free < minimum:
            return f"{format_bytes(free)} free < the {need} minimum asked for"
    util = unit.device.utilization_percent
    limit = filters.max_utilization_percent
    if limit is not None and util is not None and util > limit:
        return f"{util:.0f}% busy > the {limit:g}% utilisation limit"
    if filters.share is not None:
        from xpulaunch.core.slots import unit_rejection  # a job sharing its devices only

        return unit_rejection(unit, filters.share)
    return busy_reason(unit) if minimum is None else None


def busy_reason(unit: Unit) -> str | None:
    """Why ``unit`` counts as busy (``busy, 40.0 GiB of 80.0 GiB in use``), or None."""
    total, used = unit.memory_total_bytes, unit.memory_used_bytes
    if total and used is not None and used > BUSY_MEMORY_FRACTION * total:
        return f"busy, {format_bytes(used)} of {format_bytes(total)} in use"
    util = unit.device.utilization_percent
    if util is not None and util > BUSY_UTILIZATION_PERCENT:
        return f"busy, {util:.0f}% utilisation"
    return None


def _busy_suffix(unit: Unit) -> str:
    busy = busy_reason(unit)
    return f" (warning: {busy})" if busy else ""


def _rank(unit: Unit) -> tuple[int, int, float, int, int]:
    # Known-free memory first (most free first); unknown memory after: unknown is not idle.
    free = unit.memory_free_bytes
    util = unit.device.utilization_percent
    return (
        1 if free is None else 0,
        -(free or 0),
        util if util is not None else 0.0,
        unit.device.index,
        unit.tile or 0,
    )


# One reading of "free memory unknown" for auto, N and --min-free-memory alike: the device is
# not known to be busy, so it may be chosen, after every device known to be free; a minimum
# is checked against its total, the most it could have free. Rejecting it instead would make
# --min-free-memory refuse every card whose driver hides its usage (i915/xe without
# CAP_PERFMON), while auto took them: the two must not disagree.
UNKNOWN_FREE_POLICY = (
    "policy: a device whose free memory is unknown is not known to be busy; auto, counts and "
    "--min-free-memory may choose it (after devices known to be free), and a minimum is "
    "checked against its total memory only"
)


def _describe_free(unit: Unit) -> str:
    free = unit.memory_free_bytes
    if free is None:
        return "free memory unknown (ranked after devices known to be free; not verified)"
    return f"{format_bytes(free)} free of {format_bytes(unit.memory_total_bytes)}"


def holder_of(unit: Unit, held: Mapping[str, str]) -> str | None:
    """Who holds ``unit``: its own key, its whole card, or (for a card) any of its parts."""
    card = unit.device.key
    found = [held[key] for key in (unit.key, card) if key in held]
    if unit.tile is None and unit.mig is None:
        found += [holder for key, holder in held.items() if key.startswith(card + "/")]
    return found[0] if found else None


# What a launch that is refused may do; a launch already waiting (--wait) shows the rest only.
HELD_ADVICE = "; pick another device, wait with --wait, or share it on purpose with --shared"


def _refuse_held(units: Sequence[Unit], held: Mapping[str, str]) -> None:
    for unit in units:
        holder = holder_of(unit, held)
        if holder is not None:
            raise DeviceBusyError(f"{unit.label()} is leased by {holder}{HELD_ADVICE}")


_SLURM_GPUS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
_MASKS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")
_NOT_A_REQUEST = ("", "all", "none", "void")


def allocated_by(env: Mapping[str, str]) -> str | None:
    """Who allocated this job's GPUs, as a phrase naming the variable that says so
    (``Slurm (SLURM_STEP_GPUS=0,1)``); None where nobody did."""
    if "SLURM_JOB_ID" in env:
        for name in (*_SLURM_GPUS, *_MASKS):
            if env.get(name, "").strip():
                return f"Slurm ({name}={env[name].strip()})"
    if env.get("KUBERNETES_SERVICE_HOST"):
        request = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
        if request.lower() not in _NOT_A_REQUEST:
            return f"Kubernetes (NVIDIA_VISIBLE_DEVICES={request})"
    return None
