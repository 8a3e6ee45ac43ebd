"""Device ids as the user types them: physical indices, UUIDs (or unique prefixes), PCI
addresses, ``CARD.TILE``, MIG UUIDs, each optionally qualified by its vendor (``nvidia:0``).

Pure: ids and the visible units in, the units they name out, or a one-line error that says
what would be valid. A PCI address is normalised here for every source too
(:func:`normalize_bus_id`): each spells a BDF differently (NVML's 8-digit domain, sysfs's 4,
upper or lower case).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from xpulaunch.errors import SelectionError
from xpulaunch.model import Device, MigDevice, Unit, Vendor

if TYPE_CHECKING:
    from collections.abc import Sequence


def split_vendor(ident: str) -> tuple[Vendor | None, str]:
    """``nvidia:0`` -> (NVIDIA, ``0``); an id without a vendor prefix -> (None, id).

    The vendor-qualified form is how ids stay unambiguous on hosts with GPUs of several
    vendors, where every vendor numbers its devices from 0.
    """
    head, sep, tail = ident.partition(":")
    if sep and head.strip().lower() in _VENDOR_NAMES:
        return Vendor(head.strip().lower()), tail.strip()
    return None, ident


_VENDOR_NAMES = frozenset(v.value for v in Vendor)


def resolve_ids(
    ids: Sequence[str], units: Sequence[Unit], devices: Sequence[Device], *, elsewhere: str = ""
) -> tuple[Unit, ...]:
    """Explicit ids -> visible units. Ids are physical indices, UUIDs (or a unique prefix),
    PCI addresses, ``CARD.TILE`` for one tile of an Intel card, or a MIG UUID for one MIG
    instance; a card id hands out all of its visible units (tiles or MIG instances).

    ``devices`` are all devices of the chosen vendor (to tell "hidden" from "no such device");
    ``elsewhere`` names other vendors' GPUs, for an id that is none of these
    (:func:`~xpulaunch.core.backend.elsewhere_hint`).
    """
    chosen: list[Unit] = []
    for ident in ids:
        device, part = _find_device(_own_vendor_id(ident, devices), devices, ident, elsewhere)
        matches = [u for u in units if u.device == device and _part_of(u, part)]
        # A tile is refused for the hierarchy only where the card is handed out whole; a tile
        # the parent's mask hides (its other tile visible) is reported as hidden below.
        if (
            isinstance(part, int)
            and not matches
            and any(u.tile is None for u in units if u.device == device)
        ):
            raise SelectionError(
                "tiles are not handed out under the COMPOSITE hierarchy; "
                f"name the card ({device.index}) or set ZE_FLAT_DEVICE_HIERARCHY=FLAT",
                option="gpus",
                value=_as_written(ident),
            )
        if not matches:
            raise SelectionError(
                f"{_part_label(device, part)} is hidden by the parent's visibility "
                f"variables; visible: {_labels(units)}",
                option="gpus",
                value=_as_written(ident),
            )
        for unit in matches:
            if unit in chosen:
                raise SelectionError(
                    f"{unit.label()} is named twice", option="gpus", value=_as_written(ident)
                )
            chosen.append(unit)
    return tuple(chosen)


def _as_written(ident: str) -> str:
    """One id of the list as ``--gpus`` takes it alone: ``device=9``, since ``--gpus 9`` is a
    count (an error about id 9 that said ``--gpus 9`` read as one about nine devices)."""
    return f"device={ident}" if ident.isascii() and ident.isdigit() else ident


def _part_of(unit: Unit, part: int | MigDevice | None) -> bool:
    if part is None:
        return True
    if isinstance(part, MigDevice):
        return unit.mig == part
    return unit.tile == part


def _part_label(device: Device, part: int | MigDevice | None) -> str:
    if isinstance(part, MigDevice):
        return f"{device.label()} MIG {part.uuid}"
    return device.label() if part is None else f"{device.label()} tile {part}"


def _own_vendor_id(ident: str, devices: Sequence[Device]) -> str:
    """``ident`` without its vendor prefix; a prefix naming another vendor is an error."""
    vendor, bare = split_vendor(ident)
    others = {d.vendor for d in devices} - {vendor}
    if vendor is not None and others:
        raise SelectionError(
            f"a job runs on one vendor's GPUs and this one uses {others.pop().value}; "
            f"to use {vendor.value} GPUs, name only those (or pass the matching --backend)",
            option="gpus",
            value=_as_written(ident),
        )
    return bare


def _find_device(
    bare: str, devices: Sequence[Device], ident: str, elsewhere: str = ""
) -> tuple[Device, int | MigDevice | None]:
    if bare.lower().startswith("mig-"):
        return _mig_named(bare, devices, ident)
    card, tile = bare, None
    tile_match = re.fullmatch(r"(\d+)\.(\d+)", bare)
    if tile_match:
        card, tile = tile_match[1], int(tile_match[2])
    device = _device_named(card, ident, devices, elsewhere)
    if tile is not None and device.vendor is not Vendor.INTEL:
        # Only Intel cards have tiles; the COMPOSITE advice below would send the user to a
        # Level Zero variable that an NVIDIA or AMD GPU never reads.
        raise SelectionError(
            f"{device.label()} has no tiles (CARD.TILE names a tile of an Intel GPU); "
            f"name the GPU as device={device.index}",
            option="gpus",
            value=_as_written(ident),
        )
    if tile is not None and tile >= device.tiles:
        raise SelectionError(
            f"{device.label()} has {device.tiles} tile(s); valid tiles are 0..{device.tiles - 1}",
            option="gpus",
            value=_as_written(ident),
        )
    return device, tile


def _mig_named(bare: str, devices: Sequence[Device], ident: str) -> tuple[Device, MigDevice]:
    """The MIG instance a MIG UUID (or a unique prefix of one, as CUDA accepts) names."""
    lowered = bare.lower()
    hits = [(d, m) for d in devices for m in d.mig_devices if m.uuid.lower() == lowered]
    hits = hits or [
        (d, m) for d in devices for m in d.mig_devices if m.uuid.lower().startswith(lowered)
    ]
    if len(hits) == 1:
        return hits[0]
    every = [m.uuid for d in devices for m in d.mig_devices]
    what = f"fits {len(hits)} MIG instances" if hits else "names no MIG instance"
    raise SelectionError(
        f"{what}; MIG instances here: {', '.join(every) or 'none'}",
        option="gpus",
        value=_as_written(ident),
    )


def _device_named(card: str, ident: str, devices: Sequence[Device], elsewhere: str = "") -> Device:
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
            value=_as_written(ident),
        )
    raise SelectionError(
        f"no such device; devices here: {_device_list(devices)}"
        + (f"; {elsewhere}" if elsewhere else ""),
        option="gpus",
        value=_as_written(ident),
    )


def _device_list(devices: Sequence[Device]) -> str:
    return ", ".join(f"{d.index} ({d.pci_bus_id or d.uuid or d.name})" for d in devices) or "none"


def _matches(ident: str, device: Device) -> bool:
    if ident.isascii() and ident.isdigit():
        return int(ident) == device.index
    bus = normalize_bus_id(ident)
    if bus is not None and bus == device.pci_bus_id:
        return True
    return bool(device.uuid) and ident.lower() == (device.uuid or "").lower()


def uuid_prefix_names(ident: str, device: Device) -> bool:
    """Whether ``ident`` (``GPU-...`` or ``MIG-...``) is the start of one of the device's UUIDs."""
    lowered = ident.lower()
    if not lowered.startswith(("gpu-", "mig-")):
        return False
    uuids = [device.uuid or ""] + [m.uuid for m in device.mig_devices]
    return any(u and u.lower().startswith(lowered) for u in uuids)


def _labels(units: Sequence[Unit]) -> str:
    return ", ".join(u.label() for u in units) or "none"


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
