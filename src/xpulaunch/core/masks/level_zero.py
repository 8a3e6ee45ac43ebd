"""Intel Level Zero: card order, ``ZE_FLAT_DEVICE_HIERARCHY`` and ``ZE_AFFINITY_MASK``.

Pure, read the way compute-runtime (NEO) reads them (``affinity_mask.cpp``,
``ZE_FLAT_DEVICE_HIERARCHY``). A mask that would crash or abort the driver raises :class:`MaskError`
with one line naming the variable, the value and what would be valid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpulaunch.core.device_ids import normalize_bus_id
from xpulaunch.core.intel_family import is_xe_hpc, tiles_in_doubt
from xpulaunch.core.masks import C_SPACE, ZE_HIDE_ALL, ZE_HIERARCHY_VAR, ZE_MASK_VAR, split_list
from xpulaunch.errors import MaskError
from xpulaunch.model import Device, Hierarchy, Unit, Vendor

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "ZE_HIDE_ALL",
    "ZE_HIERARCHY_VAR",
    "ZE_MASK_VAR",
    "ZeVisible",
    "driver_order",
    "format_ze_affinity_mask",
    "parse_ze_affinity_mask",
    "pci_id_order",
    "refuse_doubtful_tiles",
    "regroup_units",
    "resolve_hierarchy",
]


@dataclass(frozen=True, slots=True)
class ZeVisible:
    """What Level Zero exposes after ``ZE_AFFINITY_MASK``, in driver order."""

    units: tuple[Unit, ...]
    notes: tuple[str, ...] = ()


_ATOLL = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def pci_id_order(value: str | None) -> bool:
    """``ZE_ENABLE_PCI_ID_DEVICE_ORDER`` as compute-runtime reads it: a bool debug variable is
    read with ``atoll`` (EnvironmentVariableReader), so any leading non-zero integer is true
    (``2``, ``01``, `` 1x``) and text without one (``true``, ``yes``) is false."""
    match = _ATOLL.match(value or "")
    return match is not None and int(match[1]) != 0


def driver_order(devices: Sequence[Device], *, pci_order: bool) -> tuple[Device, ...]:
    """Intel cards as Level Zero orders them (compute-runtime ``sortNeoDevices``).

    Discrete before integrated, then PCI address; pure PCI address order when
    ``ZE_ENABLE_PCI_ID_DEVICE_ORDER=1`` (``pci_order``). No PCI address: physical index.
    """

    def by_pci(d: Device) -> tuple[bool, str, int]:
        bdf = normalize_bus_id(d.pci_bus_id) if d.pci_bus_id else None
        return (bdf is None, bdf or "", d.index)

    intel = [d for d in devices if d.vendor is Vendor.INTEL]
    if pci_order:
        return tuple(sorted(intel, key=by_pci))
    return tuple(sorted(intel, key=lambda d: (d.integrated, *by_pci(d))))


def resolve_hierarchy(value: str | None, devices: Sequence[Device]) -> tuple[Hierarchy, str]:
    """The Level Zero hierarchy a process gets, and a note saying why."""
    if value is not None and value in {h.value for h in Hierarchy}:
        return Hierarchy(value), f"{ZE_HIERARCHY_VAR}={value} from the environment"
    # compute-runtime GfxCoreHelper::getDefaultDeviceHierarchy: FLAT for the Xe-HPC family
    # (Data Center GPU Max, one tile or two), COMPOSITE for every other family.
    # Only Max cards have several tiles, so a multi-tile card of unknown name is one too.
    max_cards = any(is_xe_hpc(d) or (d.vendor is Vendor.INTEL and d.tiles > 1) for d in devices)
    default = Hierarchy.FLAT if max_cards else Hierarchy.COMPOSITE
    why = "a Data Center GPU Max is present" if max_cards else "no Data Center GPU Max"
    if value is None:
        return default, f"{ZE_HIERARCHY_VAR} unset: driver default {default.value} ({why})"
    # execution_environment.cpp::setDeviceHierarchyMode compares with strcmp: 'flat' is unknown.
    return default, (
        f"{ZE_HIERARCHY_VAR}={value!r} is not FLAT, COMPOSITE or COMBINED (exact upper case); "
        f"the driver ignores it and uses its default {default.value} ({why})"
    )


def refuse_doubtful_tiles(devices: Sequence[Device], hierarchy: Hierarchy, what: str) -> None:
    """Flat indices count every card's tiles: with a Max card's count in doubt, a flat mask
    cannot be read or written without guessing, so refuse (``what`` names the mask)."""
    if not hierarchy.hands_out_tiles:
        return
    doubtful = [d for d in devices if tiles_in_doubt(d)]
    if doubtful:
        card = doubtful[0]
        raise MaskError(
            f"{what} counts tiles under {hierarchy.value}, but the tile count of "
            f"{card.label()} ({card.name or 'Data Center GPU Max'}) is not known for sure "
            f"(recorded: {card.tiles}); run with xpu-smi installed, record 'tiles' in the "
            f"inventory, or set {ZE_HIERARCHY_VAR}=COMPOSITE"
        )


def parse_ze_affinity_mask(
    value: str | None, devices: Sequence[Device], hierarchy: Hierarchy, *, pci_order: bool
) -> ZeVisible:
    """Read ``ZE_AFFINITY_MASK`` as compute-runtime's ``parseAffinityMask`` does."""
    cards = driver_order(devices, pci_order=pci_order)
    if value is None or value in ("", "default"):
        empty = () if value is None else (f"{ZE_MASK_VAR}={value!r} masks nothing",)
        return ZeVisible(_all_units(cards, hierarchy), empty)
    notes: list[str] = []
    enabled: dict[int, set[int]] = {}
    seen: list[tuple[int, ...]] = []
    for entry in split_list(value, ","):
        numbers = _ze_numbers(value, entry, notes)
        seen.append(numbers)
        if len(split_list(entry, ".")) > 2:
            _deep_entry(value, entry, numbers, cards, hierarchy=hierarchy, notes=notes)
        elif hierarchy.hands_out_tiles:
            _enable_flat(entry, numbers, cards, enabled, notes=notes)
        else:
            _enable_composite(entry, numbers, cards, enabled, notes=notes)
    if len(set(seen)) != len(seen):
        notes.append(f"{ZE_MASK_VAR}={value!r} repeats an entry (harmless, but avoid it)")
    if seen != sorted(seen):
        notes.append(f"{ZE_MASK_VAR}={value!r}: order is ignored, devices come in driver order")
    return ZeVisible(_units(cards, enabled, hierarchy), tuple(notes))


_STOUL = re.compile(r"[ \t\n\v\f\r]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_ULONG_MAX = 2**64 - 1


def _ze_numbers(value: str, entry: str, notes: list[str]) -> tuple[int, ...]:
    """The card and tile numbers of an entry, read as the driver reads them (first two parts)."""
    parts = split_list(entry, ".")
    if not parts:  # subEntries[0] of an empty entry reads past the end inside the driver
        raise MaskError(
            f"{ZE_MASK_VAR}={value!r}: an empty entry would crash the Intel driver; "
            "use comma-separated N or N.M entries, e.g. '0,1' or '0.1'"
        )
    return tuple(_stoul32(value, entry, part, notes) for part in parts[:2])


def _deep_entry(
    value: str,
    entry: str,
    numbers: tuple[int, ...],
    cards: Sequence[Device],
    *,
    hierarchy: Hierarchy,
    notes: list[str],
) -> None:
    """``X.Y.Z``: skipped by the current driver (parseAffinityMask enables nothing for three
    parts, and FLAT skips every dotted entry); four or more parts naming a real tile under
    COMPOSITE hit ``UNRECOVERABLE_IF`` and abort the process."""
    card = numbers[0]
    real_tile = card < len(cards) and numbers[1] < _tiles(cards[card])
    if len(split_list(entry, ".")) > 3 and real_tile and not hierarchy.hands_out_tiles:
        raise MaskError(
            f"{ZE_MASK_VAR}={value!r}: {entry!r} has more than three parts, which aborts the "
            "Intel driver; use N or N.M entries"
        )
    notes.append(f"{ZE_MASK_VAR} entry {entry!r} skipped: the driver ignores X.Y.Z entries")


def _stoul32(value: str, entry: str, text: str, notes: list[str]) -> int:
    """``static_cast<uint32_t>(std::stoul(text, nullptr, 0))`` (string_helpers.h toUint32t)."""
    match = _STOUL.match(text)
    digits = match[2] if match else ""
    base = 16 if digits[:2] in ("0x", "0X") else 8 if digits.startswith("0") else 10
    magnitude = int(digits, base) if digits else -1
    if magnitude < 0 or magnitude > _ULONG_MAX:
        raise MaskError(
            f"{ZE_MASK_VAR}={value!r}: {entry!r} is not a number the Intel driver can read "
            "(std::stoul throws inside driver init); use decimal device indices such as '0,1'"
        )
    number = (-magnitude if match and match[1] == "-" else magnitude) % 2**64 % 2**32
    if str(number) != text.strip(C_SPACE):  # hex, octal, sign, wrap or trailing text
        where = repr(text) if text == entry else f"{text!r} in {entry!r}"
        notes.append(f"{ZE_MASK_VAR}: {where} is read by the driver as {number}")
    return number


def _tiles(device: Device) -> int:
    return max(device.tiles, 1)


def _all_units(cards: Sequence[Device], hierarchy: Hierarchy) -> tuple[Unit, ...]:
    if hierarchy.hands_out_tiles:
        return tuple(Unit(c, t) for c in cards for t in range(_tiles(c)))
    return tuple(Unit(c) for c in cards)


def _enable_flat(
    entry: str,
    numbers: tuple[int, ...],
    cards: Sequence[Device],
    enabled: dict[int, set[int]],
    *,
    notes: list[str],
) -> None:
    if len(numbers) == 2:  # the driver skips X.Y under FLAT/COMBINED
        notes.append(
            f"{ZE_MASK_VAR} entry {entry!r} skipped: card.tile entries are not valid under "
            "FLAT/COMBINED (flat tile indices are)"
        )
        return
    flat = numbers[0]
    for position, card in enumerate(cards):
        if flat < _tiles(card):
            enabled.setdefault(position, set()).add(flat)
            return
        flat -= _tiles(card)
    total = sum(_tiles(c) for c in cards)
    notes.append(f"{ZE_MASK_VAR} entry {entry!r} skipped: there are only {total} tile(s)")


def _enable_composite(
    entry: str,
    numbers: tuple[int, ...],
    cards: Sequence[Device],
    enabled: dict[int, set[int]],
    *,
    notes: list[str],
) -> None:
    position = numbers[0]
    if position >= len(cards):
        notes.append(f"{ZE_MASK_VAR} entry {entry!r} skipped: only {len(cards)} Intel card(s)")
        return
    tiles = _tiles(cards[position])
    if len(numbers) == 1:
        enabled.setdefault(position, set()).update(range(tiles))
    elif numbers[1] < tiles:
        enabled.setdefault(position, set()).add(numbers[1])
    else:
        notes.append(f"{ZE_MASK_VAR} entry {entry!r} skipped: that card has {tiles} tile(s)")


def _units(
    cards: Sequence[Device], enabled: dict[int, set[int]], hierarchy: Hierarchy
) -> tuple[Unit, ...]:
    """Driver order; under COMPOSITE a fully visible card is one whole-card unit."""
    units: list[Unit] = []
    for position, card in enumerate(cards):
        tiles = sorted(enabled.get(position, ()))
        if tiles and not hierarchy.hands_out_tiles and len(tiles) == _tiles(card):
            units.append(Unit(card))
        else:
            units.extend(Unit(card, t) for t in tiles)
    return tuple(units)


def _enabled_tiles(units: Iterable[Unit], cards: Sequence[Device]) -> dict[int, set[int]]:
    positions = {c.key: i for i, c in enumerate(cards)}
    enabled: dict[int, set[int]] = {}
    for unit in units:
        position = positions.get(unit.device.key)
        tiles = _tiles(unit.device)
        if position is None or (unit.tile is not None and not 0 <= unit.tile < tiles):
            raise MaskError(f"{ZE_MASK_VAR}: {unit.label()} is not an Intel unit of this host")
        wanted = range(tiles) if unit.tile is None else (unit.tile,)
        enabled.setdefault(position, set()).update(wanted)
    return enabled


def regroup_units(
    units: Iterable[Unit], devices: Sequence[Device], hierarchy: Hierarchy, *, pci_order: bool
) -> tuple[Unit, ...]:
    """The same tiles as the units of ``hierarchy``, in driver order (what the parser gives)."""
    cards = driver_order(devices, pci_order=pci_order)
    return _units(cards, _enabled_tiles(units, cards), hierarchy)


def format_ze_affinity_mask(
    units: Iterable[Unit], devices: Sequence[Device], hierarchy: Hierarchy, *, pci_order: bool
) -> str:
    """FLAT/COMBINED: flat tile indices, ascending; COMPOSITE: ``N`` for a card, ``N.M`` a tile.

    Sorted and without repeats (the driver keeps its flat bookkeeping in mask order).
    No units -> :data:`ZE_HIDE_ALL`, because ``""`` would show every device.
    """
    cards = driver_order(devices, pci_order=pci_order)
    enabled = _enabled_tiles(units, cards)
    if not enabled:
        return ZE_HIDE_ALL
    if hierarchy.hands_out_tiles:
        offsets = [sum(_tiles(c) for c in cards[:i]) for i in range(len(cards))]
        return ",".join(str(offsets[p] + t) for p in sorted(enabled) for t in sorted(enabled[p]))
    # A whole card is N, a tile of a card shown in part N.M: as the parser reads them back.
    position = {c.key: p for p, c in enumerate(cards)}
    return ",".join(
        f"{position[u.device.key]}" + ("" if u.tile is None else f".{u.tile}")
        for u in _units(cards, enabled, hierarchy)
    )
