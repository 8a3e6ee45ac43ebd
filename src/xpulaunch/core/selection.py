"""``--gpus`` parsing and device selection: which units a job gets, and why.

Pure. The input is the parent's visible units (core.visibility), the user's request and who
holds what (leases); the output is the chosen units plus a note for every choice and rejection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from xpulaunch.core.pci import normalize_bus_id
from xpulaunch.core.units import format_bytes
from xpulaunch.errors import DeviceBusyError, SelectionError, UsageError
from xpulaunch.model import Device, Unit

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# A device is "busy" (not free for auto/N) above these readings. A CUDA context alone costs
# ~0.5 GiB, so 10% of an 8 GiB card still counts as idle.
BUSY_MEMORY_FRACTION = 0.10
BUSY_UTILIZATION_PERCENT = 50.0

_VALID = "auto, all, none, a count like 2, or device ids like 0,2 / device=GPU-... / 0000:29:00.0"
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
    count: int = 0
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
                "a count must be at least 1; use none for the CPU", option="gpus", value=text
            )
        return GpuRequest(GpuMode.COUNT, count=count)
    if normalize_bus_id(value) is not None or re.match(_UUIDISH, value) or re.match(_TILE, value):
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


def resolve_ids(
    ids: Sequence[str], units: Sequence[Unit], devices: Sequence[Device]
) -> tuple[Unit, ...]:
    """Explicit ids -> visible units. Ids are physical indices, UUIDs, PCI addresses, or
    ``CARD.TILE`` for one tile of an Intel card; a card id hands out all of its visible units.

    ``devices`` are all devices of the chosen vendor (to tell "hidden" from "no such device").
    """
    chosen: list[Unit] = []
    for ident in ids:
        device, tile = _find_device(ident, devices)
        matches = [u for u in units if u.device == device and (tile is None or u.tile == tile)]
        if (
            tile is not None
            and not matches
            and any(u.device == device and u.tile is None for u in units)
        ):
            raise SelectionError(
                "tiles are not handed out under the COMPOSITE hierarchy; "
                f"name the card ({device.index}) or set ZE_FLAT_DEVICE_HIERARCHY=FLAT",
                option="gpus",
                value=ident,
            )
        if not matches:
            raise SelectionError(
                f"{device.label()} is hidden by the parent's visibility "
                f"variables; visible: {_labels(units)}",
                option="gpus",
                value=ident,
            )
        for unit in matches:
            if unit in chosen:
                raise SelectionError(f"{unit.label()} is named twice", option="gpus", value=ident)
            chosen.append(unit)
    return tuple(chosen)


def _find_device(ident: str, devices: Sequence[Device]) -> tuple[Device, int | None]:
    card, tile = ident, None
    tile_match = re.fullmatch(r"(\d+)\.(\d+)", ident)
    if tile_match:
        card, tile = tile_match[1], int(tile_match[2])
    device = _device_named(card, ident, devices)
    if tile is not None and tile >= device.tiles:
        raise SelectionError(
            f"{device.label()} has {device.tiles} tile(s); valid tiles are 0..{device.tiles - 1}",
            option="gpus",
            value=ident,
        )
    return device, tile


def _device_named(card: str, ident: str, devices: Sequence[Device]) -> Device:
    """The device ``card`` names: exactly, or by a unique UUID prefix (``GPU-e436550d``), which
    CUDA_VISIBLE_DEVICES accepts too (CUDA C Programming Guide, "CUDA Environment Variables")."""
    for device in devices:
        if _matches(card, device):
            return device
    by_prefix = [d for d in devices if uuid_prefix_names(card, d)]
    if len(by_prefix) == 1:
        return by_prefix[0]
    if by_prefix:
        raise SelectionError(
            f"the UUID prefix fits {len(by_prefix)} devices ({_device_list(by_prefix)}); "
            "give more of it",
            option="gpus",
            value=ident,
        )
    raise SelectionError(
        f"no such device; devices here: {_device_list(devices)}", option="gpus", value=ident
    )


def _device_list(devices: Sequence[Device]) -> str:
    return ", ".join(f"{d.index} ({d.pci_bus_id or d.uuid or d.name})" for d in devices) or "none"


def _matches(ident: str, device: Device) -> bool:
    if ident.isascii() and ident.isdigit():
        return int(ident) == device.index
    bus = normalize_bus_id(ident)
    if bus is not None and bus == device.pci_bus_id:
        return True
    lowered = ident.lower()
    uuids = [device.uuid or ""] + [m.uuid for m in device.mig_devices]
    return any(u and u.lower() == lowered for u in uuids)


def uuid_prefix_names(ident: str, device: Device) -> bool:
    """Whether ``ident`` (``GPU-...`` or ``MIG-...``) is the start of one of the device's UUIDs."""
    lowered = ident.lower()
    if not lowered.startswith(("gpu-", "mig-")):
        return False
    uuids = [device.uuid or ""] + [m.uuid for m in device.mig_devices]
    return any(u and u.lower().startswith(lowered) for u in uuids)


def select(
    request: GpuRequest,
    units: Sequence[Unit],
    devices: Sequence[Device],
    *,
    filters: Filters = Filters(),
    unavailable: Mapping[str, str] | None = None,
) -> Selection:
    """Choose units for ``request`` among the parent's visible ``units``."""
    held = unavailable or {}
    if request.mode is GpuMode.NONE:
        return Selection((), ("--gpus none: running on the CPU",))
    if request.mode is GpuMode.EXPLICIT:
        chosen = resolve_ids(request.ids, units, devices)
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
    return _select_free(request, units, filters, held)


def _select_free(
    request: GpuRequest, units: Sequence[Unit], filters: Filters, held: Mapping[str, str]
) -> Selection:
    notes: list[str] = []
    eligible: list[Unit] = []
    for unit in units:
        reason = _rejection(unit, filters, held)
        if reason is None:
            eligible.append(unit)
        else:
            notes.append(f"{unit.label()}: skipped, {reason}")
    eligible.sort(key=_rank)
    if request.mode is GpuMode.COUNT:
        if len(eligible) < request.count:
            why = "; ".join(notes) or "no accelerator is visible"
            raise SelectionError(
                f"only {len(eligible)} free device(s) of {len(units)} visible ({why})",
                option="gpus",
                value=request.text,
            )
        eligible = eligible[: request.count]
    for unit in eligible:
        notes.append(f"{unit.label()}: chosen, {_describe_free(unit)}")
    return Selection(tuple(eligible), tuple(notes))


def _rejection(unit: Unit, filters: Filters, held: Mapping[str, str]) -> str | None:
    holder = holder_of(unit, held)
    if holder is not None:
        return f"leased by {holder}"
    if unit.device.integrated:
        return "integrated GPUs are only used when named explicitly"
    free = unit.memory_free_bytes
    if filters.min_free_memory_bytes is not None:
        if free is None:
            return "free memory unknown, cannot verify the minimum free memory asked for"
        if free < filters.min_free_memory_bytes:
            need = format_bytes(filters.min_free_memory_bytes)
            return f"{format_bytes(free)} free < the {need} minimum asked for"
    util = unit.device.utilization_percent
    limit = filters.max_utilization_percent
    if limit is not None and util is not None and util > limit:
        return f"{util:.0f}% busy > the {limit:g}% utilisation limit"
    busy = _busy(unit)
    if busy is not None and filters.min_free_memory_bytes is None:
        return busy
    return None


def _busy(unit: Unit) -> str | None:
    device = unit.device
    total, used = device.memory_total_bytes, device.memory_used_bytes
    if total and used is not None and used > BUSY_MEMORY_FRACTION * total:
        return f"busy, {format_bytes(used)} of {format_bytes(total)} in use"
    util = device.utilization_percent
    if util is not None and util > BUSY_UTILIZATION_PERCENT:
        return f"busy, {util:.0f}% utilisation"
    return None


def _busy_suffix(unit: Unit) -> str:
    busy = _busy(unit)
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


def _describe_free(unit: Unit) -> str:
    free = unit.memory_free_bytes
    if free is None:
        return "free memory unknown (ranked after devices known to be free)"
    return f"{format_bytes(free)} free of {format_bytes(unit.memory_total_bytes)}"


def holder_of(unit: Unit, held: Mapping[str, str]) -> str | None:
    """Who holds ``unit``: its own key, its whole card, or (for a card) any of its tiles."""
    card = unit.device.key
    for key in (unit.key, card):
        if key in held:
            return held[key]
    if unit.tile is None:
        for key, holder in held.items():
            if key.startswith(card + "/"):
                return holder
    return None


def _refuse_held(units: Sequence[Unit], held: Mapping[str, str]) -> None:
    for unit in units:
        holder = holder_of(unit, held)
        if holder is not None:
            raise DeviceBusyError(
                f"{unit.label()} is leased by {holder}; pick another device, wait with --wait, "
                "or share it on purpose with --shared"
            )


def _labels(units: Sequence[Unit]) -> str:
    return ", ".join(u.label() for u in units) or "none"
