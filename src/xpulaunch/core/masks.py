"""Parse and format each runtime's visibility variable, the way that runtime reads it.

Pure: a parser takes the variable's value (``None`` = unset) and the devices of the inventory,
and returns what the runtime would expose, in the runtime's order, with notes on anything
surprising. A value that would crash the runtime, or that the runtime refuses, raises
:class:`MaskError` with one line naming the variable, the value and what would be valid.
Reference: ``device-semantics.md`` sections 2.1, 2.2, 2.4, 4.1, 5.1 and pitfalls 4-8.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from xpulaunch.core.pci import normalize_bus_id
from xpulaunch.errors import MaskError
from xpulaunch.model import Device, Hierarchy, MigDevice, Unit, Vendor

CUDA_VAR = "CUDA_VISIBLE_DEVICES"
ZE_MASK_VAR = "ZE_AFFINITY_MASK"
ZE_HIERARCHY_VAR = "ZE_FLAT_DEVICE_HIERARCHY"
ODS_VAR = "ONEAPI_DEVICE_SELECTOR"
ROCR_VAR = "ROCR_VISIBLE_DEVICES"
HIP_VAR = "HIP_VISIBLE_DEVICES"

# An empty ZE_AFFINITY_MASK masks nothing, so hiding every Intel GPU takes an index no host
# has: the driver skips out-of-range entries and exposes zero devices (reference 2.2 [inf]).
ZE_HIDE_ALL = "999"

_C_SPACE = " \t\n\v\f\r"  # C isspace(): what strtoul/stoul skip and ROCr's trim() strips


# --- NVIDIA: CUDA_VISIBLE_DEVICES (reference 4.1) -------------------------------------------


@dataclass(frozen=True, slots=True)
class CudaEntry:
    """One device CUDA enumerates: a whole GPU, or one MIG instance of it."""

    device: Device
    mig: MigDevice | None = None

    @property
    def ident(self) -> str:
        """What makes two entries the same device for CUDA (MIG UUID, else the GPU's key)."""
        return self.mig.uuid if self.mig is not None else self.device.key


@dataclass(frozen=True, slots=True)
class CudaVisible:
    """What a CUDA process sees, in CUDA enumeration order (``cuda:0`` first)."""

    entries: tuple[CudaEntry, ...]
    notes: tuple[str, ...] = ()


def parse_cuda_visible_devices(value: str | None, devices: Sequence[Device]) -> CudaVisible:
    """Read ``CUDA_VISIBLE_DEVICES`` as the CUDA driver does (the 17-row H200 table).

    ``devices`` are the NVIDIA devices; a number names the device with that NVML index.
    """
    ordered = sorted(devices, key=lambda d: d.index)
    if value is None:
        return CudaVisible(tuple(CudaEntry(d) for d in ordered))
    if value == "":
        return CudaVisible((), (f"{CUDA_VAR} is set but empty: CUDA sees no GPU",))
    notes: list[str] = []
    entries: list[CudaEntry] = []
    raw_entries = value.split(",")
    for position, raw in enumerate(raw_entries):
        entry = _cuda_entry(raw.strip(_C_SPACE), ordered, notes)
        if entry is None:
            notes.append(_cuda_stop_note(value, raw, position, len(raw_entries)))
            break
        if any(e.ident == entry.ident for e in entries):
            raise MaskError(
                f"{CUDA_VAR}={value!r} lists {entry.device.label()} twice, and CUDA fails to "
                "initialise when a device repeats; list each GPU once"
            )
        if entry.mig is not None and any(e.mig is not None for e in entries):
            # A CUDA process enumerates a single MIG instance (MIG user guide, quoted in
            # pytorch #130181) [unv]: the later ones are not usable.
            notes.append(f"{CUDA_VAR}: {raw.strip()!r} ignored, CUDA uses one MIG instance")
            continue
        entries.append(entry)
    if not entries:
        notes.append(f"{CUDA_VAR}={value!r} hides every NVIDIA GPU")
    return CudaVisible(tuple(entries), tuple(notes))


def _cuda_entry(text: str, devices: Sequence[Device], notes: list[str]) -> CudaEntry | None:
    """One entry -> the device it names, or None when CUDA takes it as invalid."""
    if text.startswith("GPU-"):  # full UUID or a unique prefix of one
        gpus = [d for d in devices if d.uuid is not None and d.uuid.startswith(text)]
        return CudaEntry(gpus[0]) if len(gpus) == 1 else None
    if text.startswith("MIG-"):
        migs = [(d, m) for d in devices for m in d.mig_devices if m.uuid.startswith(text)]
        return CudaEntry(*migs[0]) if len(migs) == 1 else None
    # Integers are read like strtoul (torch/cuda/__init__.py::_parse_visible_devices mirrors
    # the driver: "1gpu2" reads as 1); a negative number is invalid.
    match = re.match(r"[+-]?[0-9]+", text)
    if match is None or int(match[0]) < 0:
        return None
    index = int(match[0])
    if match.end() != len(text):
        notes.append(f"{CUDA_VAR}: {text!r} is read as {index} (trailing text ignored)")
    return next((CudaEntry(d) for d in devices if d.index == index), None)


def _cuda_stop_note(value: str, raw: str, position: int, count: int) -> str:
    later = "" if position + 1 == count else ", and CUDA ignores every entry after it"
    return (
        f"{CUDA_VAR}={value!r}: entry {raw.strip()!r} names no GPU of this host "
        f"(not an index, a unique GPU-/MIG- UUID prefix){later}"
    )


def format_cuda_visible_devices(entries: Iterable[CudaEntry]) -> str:
    """UUIDs when every GPU has one (immune to CUDA_DEVICE_ORDER), else NVML indices.

    MIG instances are always written by their MIG UUID. No entries -> ``""`` (hide all).
    """
    items = list(entries)
    idents = [e.ident for e in items]
    if len(set(idents)) != len(idents):
        raise MaskError(f"{CUDA_VAR}: refusing to write a repeated device ({', '.join(idents)})")
    by_uuid = all(e.device.uuid for e in items if e.mig is None)
    return ",".join(_cuda_name(e, by_uuid=by_uuid) for e in items)


def _cuda_name(entry: CudaEntry, *, by_uuid: bool) -> str:
    if entry.mig is not None:
        return entry.mig.uuid
    return entry.device.uuid or "" if by_uuid else str(entry.device.index)


# --- Intel Level Zero: ordering, hierarchy, ZE_AFFINITY_MASK (reference 2.1, 2.2) ----------


@dataclass(frozen=True, slots=True)
class ZeVisible:
    """What Level Zero exposes after ``ZE_AFFINITY_MASK``, in driver order."""

    units: tuple[Unit, ...]
    notes: tuple[str, ...] = ()


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
    # compute-runtime GfxCoreHelper::getDefaultDeviceHierarchy: FLAT for Xe-HPC (Data Center
    # GPU Max, the only multi-tile parts), COMPOSITE for every other family.
    multi_tile = any(d.tiles > 1 for d in devices if d.vendor is Vendor.INTEL)
    default = Hierarchy.FLAT if multi_tile else Hierarchy.COMPOSITE
    why = "multi-tile Data Center GPU Max" if multi_tile else "no multi-tile Intel card"
    if value is None:
        return default, f"{ZE_HIERARCHY_VAR} unset: driver default {default.value} ({why})"
    # execution_environment.cpp::setDeviceHierarchyMode compares with strcmp: 'flat' is unknown.
    return default, (
        f"{ZE_HIERARCHY_VAR}={value!r} is not FLAT, COMPOSITE or COMBINED (exact upper case); "
        f"the driver ignores it and uses its default {default.value} ({why})"
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
    for entry in _neo_split(value, ","):
        numbers = _ze_numbers(value, entry, notes)
        seen.append(numbers)
        if hierarchy.hands_out_tiles:
            _enable_flat(entry, numbers, cards, enabled, notes=notes)
        else:
            _enable_composite(entry, numbers, cards, enabled, notes=notes)
    if len(set(seen)) != len(seen):
        notes.append(f"{ZE_MASK_VAR}={value!r} repeats an entry (harmless, but avoid it)")
    if seen != sorted(seen):
        notes.append(f"{ZE_MASK_VAR}={value!r}: order is ignored, devices come in driver order")
    return ZeVisible(_units(cards, enabled, hierarchy), tuple(notes))


def _neo_split(text: str, delimiter: str) -> list[str]:
    """compute-runtime ``StringHelpers::split``: keeps empty pieces except a trailing one."""
    pieces: list[str] = []
    position = 0
    while position < len(text):
        found = text.find(delimiter, position)
        end = len(text) if found < 0 else found
        pieces.append(text[position:end])
        position = len(text) if found < 0 else found + 1
    return pieces


_STOUL = re.compile(r"[ \t\n\v\f\r]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_ULONG_MAX = 2**64 - 1


def _ze_numbers(value: str, entry: str, notes: list[str]) -> tuple[int, ...]:
    parts = _neo_split(entry, ".")
    if not parts or len(parts) > 2:
        shape = "an empty entry" if not parts else f"{entry!r} (X.Y.Z)"
        raise MaskError(
            f"{ZE_MASK_VAR}={value!r}: {shape} would crash or abort the Intel driver; "
            "use comma-separated N or N.M entries, e.g. '0,1' or '0.1'"
        )
    return tuple(_stoul32(value, entry, part, notes) for part in parts)


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
    if str(number) != text.strip(_C_SPACE):  # hex, octal, sign, wrap or trailing text
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

    Sorted and without repeats (the driver keeps its flat bookkeeping in mask order [inf]).
    No units -> :data:`ZE_HIDE_ALL`, because ``""`` would show every device.
    """
    cards = driver_order(devices, pci_order=pci_order)
    enabled = _enabled_tiles(units, cards)
    if not enabled:
        return ZE_HIDE_ALL
    if hierarchy.hands_out_tiles:
        offsets = [sum(_tiles(c) for c in cards[:i]) for i in range(len(cards))]
        return ",".join(str(offsets[p] + t) for p in sorted(enabled) for t in sorted(enabled[p]))
    parts: list[str] = []
    for position in sorted(enabled):
        tiles = sorted(enabled[position])
        if len(tiles) == _tiles(cards[position]):
            parts.append(str(position))
        else:
            parts.extend(f"{position}.{t}" for t in tiles)
    return ",".join(parts)


# --- ONEAPI_DEVICE_SELECTOR (reference 2.4; intel/llvm sycl/source/detail/device_filter.cpp) --


@dataclass(frozen=True, slots=True)
class OneApiFilter:
    """Which Level Zero GPU positions (after the ZE mask, from 0) a SYCL process keeps."""

    positions: tuple[int, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _OdsTerm:
    backend: str
    device: str  # "*", a device type, or a number
    sub_device: bool  # N.M, N.*, *.* ...: we treat it as its root device


_ODS_BACKENDS = frozenset({"*", "level_zero", "opencl", "cuda", "hip", "native_cpu"})
_ODS_TYPES = frozenset({"*", "gpu", "cpu", "fpga", "acc"})


def parse_oneapi_device_selector(value: str | None, visible_count: int) -> OneApiFilter:
    """Positions ``0..visible_count-1`` of the Level Zero GPUs that survive the selector."""
    everything = tuple(range(visible_count))
    if value is None:
        return OneApiFilter(everything)
    if value.strip(_C_SPACE) == "":  # DPC++ Parse_ONEAPI_DEVICE_SELECTOR: "" accepts anything
        return OneApiFilter(everything, (f"{ODS_VAR} is empty: SYCL accepts every device",))
    notes: list[str] = []
    accepts: list[_OdsTerm] = []
    discards: list[_OdsTerm] = []
    for text in (t for t in value.split(";") if t.strip(_C_SPACE)):
        discard = text.strip(_C_SPACE).startswith("!")
        terms = _ods_terms(value, text.strip(_C_SPACE).lstrip("!"))
        (discards if discard else accepts).extend(terms)
    _ods_notes(value, accepts, discards, visible_count, notes)
    # Only discard terms: an implicit "accept every root device" comes first (reference 2.4).
    accepted = [p for p in everything if not accepts or any(_ods_match(t, p) for t in accepts)]
    kept = tuple(p for p in accepted if not any(_ods_match(t, p) for t in discards))
    if visible_count and not kept:
        notes.append(f"{ODS_VAR}={value!r} keeps no Level Zero GPU: SYCL sees no Intel GPU")
    return OneApiFilter(kept, tuple(notes))


def _ods_terms(value: str, text: str) -> list[_OdsTerm]:
    pair = [p for p in text.split(":") if p]
    backend = pair[0].strip(_C_SPACE).lower().removeprefix("ext_oneapi_") if pair else ""
    problem = None
    if backend not in _ODS_BACKENDS:
        problem = f"{text!r} needs a backend (*, level_zero, opencl, cuda, hip, native_cpu)"
    elif len(pair) != 2:
        problem = f"{text!r} must be backend:devices, e.g. 'level_zero:gpu' or 'level_zero:0,1'"
    if problem is not None:
        raise MaskError(f"{ODS_VAR}={value!r}: {problem}")
    devices = [d.strip(_C_SPACE).lower() for d in pair[1].split(",") if d.strip(_C_SPACE)]
    if not devices:
        raise MaskError(f"{ODS_VAR}={value!r}: {text!r} lists no device; try '{backend}:*'")
    return [_ods_term(value, backend, d) for d in devices]


_ODS_DEVICE = re.compile(r"(?P<top>\*|[a-z]+|[0-9]+)(?P<subs>(?:\.(?:\*|[0-9]+)){0,2})")


def _ods_term(value: str, backend: str, device: str) -> _OdsTerm:
    match = _ODS_DEVICE.fullmatch(device)
    top = match["top"] if match else ""
    subs = match["subs"].split(".")[1:] if match else []
    # Grammar rules of device_filter.cpp::Parse_ODS_Device: a type takes no sub-device, a
    # wildcard parent takes only wildcard children.
    valid = match is not None and (top in _ODS_TYPES or top.isdigit())
    valid = valid and not (subs and top.isalpha())
    chain = [top, *subs]
    valid = valid and all(b == "*" for a, b in itertools.pairwise(chain) if a == "*")
    if not valid:
        raise MaskError(
            f"{ODS_VAR}={value!r}: device {device!r} is not *, gpu, cpu, fpga, N, N.M, N.* or *.*"
        )
    return _OdsTerm(backend, top, bool(subs))


def _ods_match(term: _OdsTerm, position: int) -> bool:
    """Does ``term`` select the Level Zero GPU at ``position``?"""
    if term.backend not in ("*", "level_zero"):
        return False
    return term.device in ("*", "gpu") or term.device == str(position)


def _opencl_gpus(term: _OdsTerm) -> bool:
    return term.backend in ("*", "opencl") and term.device in ("*", "gpu")


def _ods_notes(
    value: str,
    accepts: Sequence[_OdsTerm],
    discards: Sequence[_OdsTerm],
    visible_count: int,
    notes: list[str],
) -> None:
    for term in (*accepts, *discards):
        if term.device.isdigit() and int(term.device) >= visible_count:
            notes.append(
                f"{ODS_VAR}: {term.backend}:{term.device} matches nothing "
                f"({visible_count} Level Zero device(s) after {ZE_MASK_VAR})"
            )
    if any(t.sub_device for t in (*accepts, *discards)):
        notes.append(
            f"{ODS_VAR}={value!r} names sub-devices; xpulaunch treats each as its whole root "
            "device (sub-devices only exist under COMPOSITE)"
        )
    if any(_opencl_gpus(t) for t in accepts) and not any(_opencl_gpus(t) for t in discards):
        notes.append(
            f"{ODS_VAR}={value!r} also accepts OpenCL GPUs: SYCL lists each Intel GPU twice"
        )


# --- AMD: ROCR_VISIBLE_DEVICES, then HIP_VISIBLE_DEVICES (reference 5.1) --------------------


@dataclass(frozen=True, slots=True)
class AmdVisible:
    """What a HIP process sees, in HIP order, with notes."""

    devices: tuple[Device, ...]
    notes: tuple[str, ...] = ()


def parse_rocr_visible_devices(value: str | None, devices: Sequence[Device]) -> tuple[Device, ...]:
    """Read ``ROCR_VISIBLE_DEVICES`` as ROCr does; the result is in list order."""
    return _rocr(value, devices, [])


def parse_hip_visible_devices(
    value: str | None,
    after_rocr: Sequence[Device],
    *,
    rocr_value: str | None = None,
    name: str = HIP_VAR,
) -> tuple[Device, ...]:
    """Read ``HIP_VISIBLE_DEVICES`` (indices relative to ``after_rocr``) as HIP does.

    ``name`` is the variable HIP took the value from (``CUDA_VISIBLE_DEVICES`` when
    HIP_VISIBLE_DEVICES is unset or empty). Pass ``rocr_value`` when ROCR_VISIBLE_DEVICES
    is set: PyTorch refuses a HIP_VISIBLE_DEVICES with more entries than it.
    """
    return _hip(value, after_rocr, rocr_value, name, [])


def amd_visible(
    rocr_value: str | None,
    hip_value: str | None,
    devices: Sequence[Device],
    *,
    hip_name: str = HIP_VAR,
) -> AmdVisible:
    """ROCR first, then HIP on what ROCR left (the two parsers above, with their notes)."""
    notes: list[str] = []
    after_rocr = _rocr(rocr_value, devices, notes)
    return AmdVisible(_hip(hip_value, after_rocr, rocr_value, hip_name, notes), tuple(notes))


_STRTOL_FULL = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_ROCR_UUID = re.compile(r"GPU-[0-9A-F]{16}")


def _rocr(value: str | None, devices: Sequence[Device], notes: list[str]) -> tuple[Device, ...]:
    """ROCr ``RvdFilter`` (src/core/runtime/amd_filter_device.cpp)."""
    ordered = sorted(devices, key=lambda d: d.index)
    if value is None:
        return tuple(ordered)
    if value == "":  # RvdFilter::SelectZeroDevices: set but empty surfaces zero devices
        notes.append(f"{ROCR_VAR} is set but empty: ROCm sees no GPU")
        return ()
    tokens = value.split(",")[:-1] if value.endswith(",") else value.split(",")  # getline
    chosen: list[Device] = []
    # BuildUsrDeviceList reads at most one token per GPU; later tokens are never looked at.
    # The surviving devices are ranked in list order (usrDeviceList_[index] = rank) [inf].
    for token in (t.strip(_C_SPACE).upper() for t in tokens[: len(ordered)]):
        device = _rocr_token(value, token, ordered)
        if device is None or device.key in {d.key for d in chosen}:  # the list ends here
            notes.append(f"{ROCR_VAR}={value!r}: ROCr stops at {token!r}; later entries ignored")
            return tuple(chosen)
        chosen.append(device)
    if len(tokens) > len(ordered):
        notes.append(f"{ROCR_VAR}: ROCr reads only the first {len(ordered)} entries")
    return tuple(chosen)


def _rocr_token(value: str, token: str, devices: Sequence[Device]) -> Device | None:
    if token == "":  # token.at(0) on an empty token throws inside ROCr init [inf]
        raise MaskError(
            f"{ROCR_VAR}={value!r} has an empty entry, which ROCm cannot parse; "
            "use indices or GPU- UUIDs separated by single commas"
        )
    if token.startswith("G"):  # ProcessUuidToken: a unique prefix of "GPU-<16 hex digits>"
        if not 5 <= len(token) <= 20:
            return None
        hits = [d for d in devices if d.uuid and d.uuid.upper().startswith(token)]
        return hits[0] if len(hits) == 1 else None
    if _STRTOL_FULL.fullmatch(token) is None:  # strtol(token, &end, 0) must use every char
        return None
    number = int(token, 0) if not re.fullmatch(r"[+-]?0[0-7]+", token) else int(token, 8)
    number = max(min(number, 2**63 - 1), -(2**63))  # strtol saturates at LONG_MIN/MAX
    index = (number + 2**31) % 2**32 - 2**31  # ...then it is stored in an int32_t
    return next((d for d in devices if d.index == index), None)


def _hip(
    value: str | None,
    after_rocr: Sequence[Device],
    rocr_value: str | None,
    name: str,
    notes: list[str],
) -> tuple[Device, ...]:
    """ROCclr ``roc::Device::init`` (rocdevice.cpp): HIP's own device list."""
    if value is None or value == "":  # HIP_VISIBLE_DEVICES[0] == '\0': no HIP filtering
        return tuple(after_rocr)
    if name == HIP_VAR and rocr_value is not None:
        hip_count, rocr_count = len(value.split(",")), len(rocr_value.split(","))
        if hip_count > rocr_count:
            raise MaskError(
                f"{HIP_VAR}={value!r} lists {hip_count} devices but {ROCR_VAR}={rocr_value!r} "
                f"only {rocr_count} (PyTorch raises RuntimeError); list at most {rocr_count} "
                f"indices relative to {ROCR_VAR}"
            )
    chosen: list[Device] = []
    for text in value.split(",")[:-1] if value.endswith(",") else value.split(","):
        device = _hip_entry(text, after_rocr)
        if device is None:  # "anything to the right of invalid deviceId has to be discarded"
            notes.append(f"{name}={value!r}: HIP stops at {text!r}; later entries ignored")
            break
        if device not in chosen:  # a repeated index is skipped, not an error
            chosen.append(device)
    return tuple(chosen)


def _hip_entry(text: str, after_rocr: Sequence[Device]) -> Device | None:
    if "GPU-" in text:  # a substring of an agent UUID; case compared loosely [unv]
        for device in after_rocr:
            if device.uuid and text.upper() in device.uuid.upper():
                return device
        return None
    # atoi() plus "str_id == std::to_string(index)": plain decimal, nothing else.
    if re.fullmatch(r"0|[1-9][0-9]*", text) is None or int(text) >= len(after_rocr):
        return None
    return after_rocr[int(text)]


def format_rocr_visible_devices(devices: Iterable[Device]) -> str:
    """ROCr UUIDs (``GPU-`` + 16 hex digits) when every device has one, else indices."""
    items = list(devices)
    if len({d.key for d in items}) != len(items):
        raise MaskError(f"{ROCR_VAR}: refusing to write a repeated device")
    if all(d.uuid and _ROCR_UUID.fullmatch(d.uuid.upper()) for d in items):
        return ",".join(d.uuid or "" for d in items)
    return ",".join(str(d.index) for d in items)
