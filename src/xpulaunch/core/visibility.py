"""What the parent lets us hand out, per vendor, and the visibility variables of one child.

Pure: inventory and parent env in; units, notes and an env dict out. Devices are kept by
physical identity; mask syntax only appears in the env written for a child, computed from
that identity, and it replaces the parent's mask (docs/CONTRACT.md, section 2).

MIG: a GPU in MIG mode is handed out as its MIG instances, one
:class:`~xpulaunch.model.Unit` each (key ``<card>/MIG-...``), because a CUDA process
enumerates a single MIG instance (the MIG user guide, as quoted in pytorch #130181; not
verified on MIG hardware here). A child is given at most one instance, by its MIG UUID, and
nothing else: with a MIG instance in its list CUDA enumerates that instance alone (CUDA
Programming Guide 5.2.1.1).

Each vendor's parser is imported by the functions that read or write that vendor's variables
(:mod:`xpulaunch.core.masks`), so a plan loads those of the vendors on the host and no other.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpulaunch.core.masks import (
    CUDA_VAR,
    HIP_VAR,
    ODS_VAR,
    ROCR_VAR,
    ZE_HIDE_ALL,
    ZE_HIERARCHY_VAR,
    ZE_MASK_VAR,
)
from xpulaunch.errors import MaskError, SelectionError
from xpulaunch.model import Device, Hierarchy, Inventory, Unit, Vendor

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from xpulaunch.core.masks.cuda import CudaEntry
    from xpulaunch.core.masks.oneapi import RootPick

CUDA_ORDER_VAR = "CUDA_DEVICE_ORDER"
PCI_ORDER_VAR = "ZE_ENABLE_PCI_ID_DEVICE_ORDER"
SYCL_FILTER_VAR = "SYCL_DEVICE_FILTER"
GPU_ORDINAL_VAR = "GPU_DEVICE_ORDINAL"

# The variables through which a parent restricts each vendor.
VENDOR_VARS: Mapping[Vendor, tuple[str, ...]] = {
    Vendor.NVIDIA: (CUDA_VAR,),
    Vendor.INTEL: (ZE_MASK_VAR, ZE_HIERARCHY_VAR, ODS_VAR, SYCL_FILTER_VAR),
    Vendor.AMD: (ROCR_VAR, HIP_VAR, GPU_ORDINAL_VAR),
}


@dataclass(frozen=True, slots=True)
class Visible:
    """The units of one vendor the parent lets us hand out, in the child runtime's order.

    ``hidden_all``: the vendor has devices but the parent's variables hide every one.
    ``hierarchy``: for Intel, the Level Zero hierarchy these units belong to.
    """

    units: tuple[Unit, ...]
    hidden_all: bool = False
    notes: tuple[str, ...] = ()
    hierarchy: Hierarchy | None = None


def parent_visible(
    inventory: Inventory,
    vendor: Vendor,
    parent_env: Mapping[str, str],
    *,
    hierarchy: Hierarchy | None,
) -> Visible:
    """Units of ``vendor`` visible under the parent's variables.

    ``hierarchy`` (Intel only) is the hierarchy children will get; None = the parent's own.
    Intel FLAT/COMBINED gives one unit per tile, COMPOSITE one per card (or per visible tile
    of a card the parent's mask shows only in part). Raises :class:`MaskError`.
    """
    devices = inventory.of(vendor)
    if vendor is Vendor.NVIDIA:
        return _nvidia_visible(devices, parent_env)
    if vendor is Vendor.INTEL:
        return _intel_visible(devices, parent_env, hierarchy)
    return _amd_visible(devices, parent_env)


def _nvidia_visible(devices: Sequence[Device], env: Mapping[str, str]) -> Visible:
    from xpulaunch.core.masks.cuda import parse_cuda_visible_devices

    value = env.get(CUDA_VAR)
    parsed = parse_cuda_visible_devices(value, devices)
    notes = list(parsed.notes)
    units: list[Unit] = []
    for entry in parsed.entries:
        if any(u.device.key == entry.device.key for u in units):
            notes.append(f"{CUDA_VAR} names {entry.device.label()} and a MIG instance of it")
            continue
        units.extend(_nvidia_units(entry))
        if entry.device.mig_devices and entry.mig is None:
            notes.append(
                f"{entry.device.label()} is in MIG mode: its {len(entry.device.mig_devices)} "
                "MIG instance(s) are handed out one by one (a CUDA process uses one instance, "
                "NVIDIA's MIG user guide)"
            )
    numeric = value is not None and any(e.strip()[:1].isdigit() for e in value.split(","))
    if numeric and env.get(CUDA_ORDER_VAR) != "PCI_BUS_ID" and len({d.name for d in devices}) > 1:
        notes.append(
            f"{CUDA_VAR}={value!r} is read as nvidia-smi indices, but without "
            f"{CUDA_ORDER_VAR}=PCI_BUS_ID CUDA may number these mixed GPUs fastest-first"
        )
    return Visible(tuple(units), bool(devices) and not units, tuple(notes))


def _nvidia_units(entry: CudaEntry) -> list[Unit]:
    """A GPU in MIG mode is its instances (the one the parent named, else every one)."""
    if entry.mig is not None:
        return [Unit(entry.device, mig=entry.mig)]
    if entry.device.mig_devices:
        return [Unit(entry.device, mig=m) for m in entry.device.mig_devices]
    return [Unit(entry.device)]


def _intel_visible(
    devices: Sequence[Device], env: Mapping[str, str], hierarchy: Hierarchy | None
) -> Visible:
    from xpulaunch.core.masks import level_zero, oneapi

    parent_h, _ = level_zero.resolve_hierarchy(env.get(ZE_HIERARCHY_VAR), devices)
    child_h = hierarchy or parent_h
    if not devices:
        return Visible((), hierarchy=child_h)
    pci_order = level_zero.pci_id_order(env.get(PCI_ORDER_VAR))
    if env.get(ZE_MASK_VAR) not in (None, "", "default"):
        level_zero.refuse_doubtful_tiles(devices, parent_h, f"the parent's {ZE_MASK_VAR}")
    # ZE_AFFINITY_MASK acts inside the driver, under the parent's hierarchy; SYCL's selector
    # then numbers the surviving root devices from 0 (compute-runtime's affinity mask composition).
    ze = level_zero.parse_ze_affinity_mask(
        env.get(ZE_MASK_VAR), devices, parent_h, pci_order=pci_order
    )
    roots = _root_devices(ze.units, parent_h)
    ods = oneapi.parse_oneapi_device_selector(env.get(ODS_VAR), len(roots))
    kept = [u for p in ods.positions for u in _kept_of(roots[p], ods.pick(p), parent_h)]
    if ods.positions and not kept:
        raise MaskError(_selects_nothing(env.get(ODS_VAR) or "", parent_h))
    units = level_zero.regroup_units(dict.fromkeys(kept), devices, child_h, pci_order=pci_order)
    notes = (*ze.notes, *ods.notes, *_intel_notes(env, parent_h, child_h, units))
    return Visible(units, not units, (*notes, *_two_driver_note(devices)), child_h)


def _root_devices(units: Sequence[Unit], hierarchy: Hierarchy) -> list[list[Unit]]:
    """Units grouped as Level Zero root devices: a tile each under FLAT, a card (or the
    visible part of one) under COMPOSITE."""
    if hierarchy.hands_out_tiles:
        return [[unit] for unit in units]
    return [list(card) for _, card in itertools.groupby(units, key=lambda u: u.device.key)]


def _kept_of(root: list[Unit], pick: RootPick, hierarchy: Hierarchy) -> list[Unit]:
    """What the selector keeps of one root device: itself when a term names it, and the
    sub-devices its sub-device terms name (platform_impl.cpp amendDeviceAndSubDevices)."""
    subs = _sub_devices(root, hierarchy)
    return (root if pick.whole else []) + [subs[m] for m in pick.sub_devices(len(subs))]


def _sub_devices(root: list[Unit], hierarchy: Hierarchy) -> list[Unit]:
    """A root device's sub-devices: none under FLAT and COMBINED, where the root devices are
    the tiles themselves (compute-runtime DeviceImp::getSubDevices answers 0 under FLAT; a
    tile has none under COMBINED); under COMPOSITE the card's visible tiles, in order."""
    if hierarchy.hands_out_tiles:
        return []
    if len(root) == 1 and root[0].tile is None and root[0].device.tiles > 1:
        return [Unit(root[0].device, t) for t in range(root[0].device.tiles)]
    return [u for u in root if u.tile is not None]


def _selects_nothing(value: str, hierarchy: Hierarchy) -> str:
    if hierarchy.hands_out_tiles:
        why = (
            f"under {ZE_HIERARCHY_VAR}={hierarchy.value} each root device is a tile with no "
            "sub-devices, so SYCL keeps nothing for N.M, N.* or *.*; use 'level_zero:*' (every "
            f"tile) or 'level_zero:N' (flat tile index), or set {ZE_HIERARCHY_VAR}=COMPOSITE"
        )
    else:
        why = (
            "only a card with two or more visible tiles has sub-devices (Data Center GPU Max "
            "1550), so SYCL keeps nothing for N.M, N.* or *.* here; use 'level_zero:*' or "
            "'level_zero:N'"
        )
    return f"{ODS_VAR}={value!r} selects no Intel GPU: {why}"


def _two_driver_note(devices: Sequence[Device]) -> list[str]:
    from xpulaunch.core.intel_family import needs_legacy_driver

    legacy = [d for d in devices if needs_legacy_driver(d)]
    installed = {d.extra.get("level_zero_legacy1") for d in devices}
    if not legacy or len(legacy) == len(devices) or installed == {False}:
        return []
    where = "which is installed" if True in installed else "where it is installed"
    return [
        f"{legacy[0].label()} is a Gen9/Gen11 iGPU, served by compute-runtime's legacy1 "
        f"driver, {where}; each Level Zero driver applies {ZE_MASK_VAR} to its own devices, "
        "so a child may see that iGPU as well (remove the legacy1 driver, or check "
        "torch.xpu.device_count() in the child)"
    ]


def _intel_notes(
    env: Mapping[str, str], parent_h: Hierarchy, child_h: Hierarchy, units: Sequence[Unit]
) -> list[str]:
    notes: list[str] = []
    if child_h is not parent_h:
        notes.append(
            f"children get {ZE_HIERARCHY_VAR}={child_h.value}; the parent's "
            f"{ZE_MASK_VAR} was read under {parent_h.value}"
        )
    if SYCL_FILTER_VAR in env:
        notes.append(f"{SYCL_FILTER_VAR} is obsolete ({ODS_VAR} replaced it): children lose it")
    if not child_h.hands_out_tiles:
        split = sorted({u.device.label() for u in units if u.tile is not None})
        if split:
            # oneapi-src/level-zero #86: two or more tiles of one card are exposed as their
            # parent device, with those tiles as its sub-devices.
            notes.append(
                f"only some tiles of {', '.join(split)} are visible; a child given several of "
                "them sees one device with those tiles as sub-devices"
            )
    return notes


def _amd_visible(devices: Sequence[Device], env: Mapping[str, str]) -> Visible:
    from xpulaunch.core.masks.rocm import amd_visible

    hip_name, hip_value = _hip_source(env)
    seen = amd_visible(env.get(ROCR_VAR), hip_value, devices, hip_name=hip_name)
    notes = list(seen.notes)
    if hip_name == CUDA_VAR:
        notes.append(f"HIP reads {CUDA_VAR}={hip_value!r} because {HIP_VAR} is unset or empty")
    if GPU_ORDINAL_VAR in env:
        # ROCclr reads GPU_DEVICE_ORDINAL only for OpenCL, HIP and CUDA_VISIBLE_DEVICES for HIP.
        notes.append(f"{GPU_ORDINAL_VAR} applies to OpenCL only; children lose it")
    notes += _shared_uuid_notes(devices, env.get(ROCR_VAR))
    units = tuple(Unit(d) for d in seen.devices)
    return Visible(units, bool(devices) and not units, tuple(notes))


def _shared_uuid_notes(devices: Sequence[Device], rocr: str | None) -> list[str]:
    """A parent mask naming a UUID that several partitions of one card share (ROCm before
    7.0.1): ROCr refuses the ambiguous token, so the parent's own processes see no GPU."""
    tokens = {t.strip().upper() for t in (rocr or "").split(",")} - {""}
    sharing = [d for d in devices if str(d.extra.get("rocr_uuid_shared") or "").upper() in tokens]
    if not sharing:
        return []
    mode = sharing[0].extra.get("partition_mode") or "partitioned"
    return [
        f"{ROCR_VAR} names {sharing[0].extra.get('rocr_uuid_shared')}, which the "
        f"{len(sharing)} partitions ({mode}) of card {sharing[0].extra.get('card_pci_bus_id')} "
        "share: ROCr refuses an ambiguous UUID and shows no GPU; name partitions by index"
    ]


def _refuse_unknown_partitions(units: Sequence[Unit], devices: Sequence[Device], mask: str) -> None:
    """A partitioned card whose partitions the probe could not list (no KFD topology) is
    several ROCr agents under one PCI address: neither it nor, by index, any card after it can
    be named in ROCR_VISIBLE_DEVICES."""
    unknown = [d for d in devices if d.extra.get("partitions_unknown")]
    if not unknown:
        return
    given = [u.device for u in units if u.device.extra.get("partitions_unknown")]
    by_index = not mask.startswith("GPU-")
    if given or by_index:
        card = (given or unknown)[0]
        raise SelectionError(
            f"{card.label()} is in {card.extra.get('partition_mode')} partition mode and its "
            "partitions cannot be told apart (the KFD topology in /sys/class/kfd was not "
            f"readable), so {ROCR_VAR} cannot name "
            + ("it" if given else "devices by index here")
            + "; switch the card to SPX or make /sys/class/kfd readable"
        )


def _hip_source(env: Mapping[str, str]) -> tuple[str, str | None]:
    """Which variable HIP reads: HIP_VISIBLE_DEVICES unless it is unset or empty, then
    CUDA_VISIBLE_DEVICES (ROCclr rocdevice.cpp: ``HIP_VISIBLE_DEVICES[0] != '\\0'``)."""
    hip = env.get(HIP_VAR)
    if not hip and env.get(CUDA_VAR):
        return CUDA_VAR, env.get(CUDA_VAR)
    return HIP_VAR, hip


def hiding_notes(env: Mapping[str, str | None], vendor: Vendor | None) -> list[str]:
    """Why a child's env holds a value that hides another vendor's GPUs (for the plan)."""
    hiders = (
        (Vendor.NVIDIA, CUDA_VAR, "", 'CUDA_VISIBLE_DEVICES="" hides every NVIDIA GPU', ""),
        (
            Vendor.INTEL,
            ZE_MASK_VAR,
            ZE_HIDE_ALL,
            f"{ZE_MASK_VAR}={ZE_HIDE_ALL} hides every Intel GPU",
            f" ({ZE_HIDE_ALL} is an index no host has; an empty mask would hide nothing)",
        ),
        (Vendor.AMD, ROCR_VAR, "", 'ROCR_VISIBLE_DEVICES="" hides every AMD GPU', ""),
    )
    who = "this CPU job" if vendor is None else f"this {vendor.value} job"
    return [
        f"{text} from the children of {who}{why}"
        for owner, name, value, text, why in hiders
        if owner is not vendor and env.get(name) == value
    ]


# --- One child's visibility variables -------------------------------------------------------


def child_order(
    vendor: Vendor | None,
    units: Sequence[Unit],
    inventory: Inventory,
    parent_env: Mapping[str, str],
) -> tuple[Unit, ...]:
    """``units`` in the order the runtime of a child given all of them numbers them.

    CUDA and ROCr number devices in the order of the list written for the child. Level Zero
    ignores the order of ``ZE_AFFINITY_MASK`` (level-zero spec, "Affinity Mask"): a child's
    devices come in driver order, as :func:`_intel_env` writes ``ZE_ENABLE_PCI_ID_DEVICE_ORDER``.
    """
    if vendor is not Vendor.INTEL:
        return tuple(units)
    from xpulaunch.core.masks import level_zero

    pci_order = level_zero.pci_id_order(parent_env.get(PCI_ORDER_VAR))
    cards = level_zero.driver_order(inventory.of(Vendor.INTEL), pci_order=pci_order)
    position = {card.key: p for p, card in enumerate(cards)}
    return tuple(sorted(units, key=lambda u: (position[u.device.key], u.tile or 0)))


def child_visibility_env(
    vendor: Vendor | None,
    units: Sequence[Unit],
    inventory: Inventory,
    parent_env: Mapping[str, str],
    *,
    hierarchy: Hierarchy | None,
) -> dict[str, str | None]:
    """The visibility variables of a child that must see exactly ``units`` (None = remove).

    Vendors other than ``vendor`` (all of them for a CPU child, ``vendor`` None) are hidden,
    when they have devices on this host or the parent set one of their variables.
    Raises :class:`SelectionError` for a MIG instance with any other unit (CUDA enumerates
    one MIG instance alone).
    """
    _check_units(vendor, units)
    present = {d.vendor for d in inventory.devices}
    present |= {v for v, names in VENDOR_VARS.items() if any(n in parent_env for n in names)}
    if vendor is not None:
        present.add(vendor)
    env: dict[str, str | None] = {}
    if Vendor.NVIDIA in present:
        env.update(_nvidia_env(units if vendor is Vendor.NVIDIA else ()))
    if Vendor.INTEL in present:
        mine = units if vendor is Vendor.INTEL else ()
        env.update(_intel_env(mine, inventory, parent_env, hierarchy))
    if Vendor.AMD in present:  # last: it decides what happens to CUDA_VISIBLE_DEVICES
        env.update(_amd_env(units if vendor is Vendor.AMD else (), inventory, parent_env))
    return env


def _check_units(vendor: Vendor | None, units: Sequence[Unit]) -> None:
    wrong = [u.label() for u in units if u.device.vendor is not vendor]
    if wrong:
        kind = "a CPU child" if vendor is None else f"a {vendor.value} child"
        raise MaskError(f"cannot give {', '.join(wrong)} to {kind}")
    keys = [u.key for u in units]
    if len(set(keys)) != len(keys):
        raise MaskError(f"a child cannot be given the same unit twice ({', '.join(keys)})")


def _nvidia_env(units: Sequence[Unit]) -> dict[str, str | None]:
    if not units:  # "" hides every CUDA device (CUDA Programming Guide, "CUDA_VISIBLE_DEVICES")
        return {CUDA_VAR: ""}
    _refuse_mig_with_others(units)
    from xpulaunch.core.masks.cuda import CudaEntry, format_cuda_visible_devices

    entries = [CudaEntry(u.device, u.mig) for u in units]
    # PCI_BUS_ID makes CUDA numbering match nvidia-smi; UUIDs make the mask immune to order.
    return {CUDA_ORDER_VAR: "PCI_BUS_ID", CUDA_VAR: format_cuda_visible_devices(entries)}


def _refuse_mig_with_others(units: Sequence[Unit]) -> None:
    """A CUDA process enumerates one MIG instance, and with a MIG instance in its
    CUDA_VISIBLE_DEVICES no whole GPU either (CUDA Programming Guide 5.2.1.1: "Only single MIG
    instance enumeration is supported"); the child would see one device of those planned."""
    migs = [u.label() for u in units if u.mig is not None]
    if not migs or len(units) == 1:
        return
    whole = [u.label() for u in units if u.mig is None]
    what = (
        f"{len(migs)} MIG instances ({', '.join(migs)})"
        if not whole
        else f"a MIG instance and {len(units) - 1} other device(s) ({', '.join(migs + whole)})"
    )
    raise SelectionError(
        f"one worker would get {what}, but a CUDA process uses one MIG instance and, with "
        "it, no other GPU (NVIDIA: only single MIG instance enumeration is supported): run one "
        "worker per device with --nproc-per-node auto --isolate, or select one with --gpus 1 "
        "or --gpus MIG-..."
    )


def _intel_env(
    units: Sequence[Unit],
    inventory: Inventory,
    parent_env: Mapping[str, str],
    hierarchy: Hierarchy | None,
) -> dict[str, str | None]:
    env: dict[str, str | None] = {SYCL_FILTER_VAR: None} if SYCL_FILTER_VAR in parent_env else {}
    if not units:
        # ZE_AFFINITY_MASK="" would show every Intel GPU; an index no host has hides them all
        # (compute-runtime reads the mask once for both), from Level Zero and from Intel's OpenCL
        # driver, which shares NEO.
        env[ZE_MASK_VAR] = ZE_HIDE_ALL
        return env
    from xpulaunch.core.masks import level_zero

    intel = inventory.of(Vendor.INTEL)
    chosen = hierarchy or level_zero.resolve_hierarchy(parent_env.get(ZE_HIERARCHY_VAR), intel)[0]
    pci_order = level_zero.pci_id_order(parent_env.get(PCI_ORDER_VAR))
    level_zero.refuse_doubtful_tiles(intel, chosen, f"the child's {ZE_MASK_VAR}")
    env[ZE_HIERARCHY_VAR] = chosen.value  # explicit: the default differs per GPU family
    # explicit too: the mask below is written in this order, whatever the parent's spelling
    env[PCI_ORDER_VAR] = "1" if pci_order else "0"
    env[ZE_MASK_VAR] = level_zero.format_ze_affinity_mask(units, intel, chosen, pci_order=pci_order)
    env[ODS_VAR] = "level_zero:gpu"  # no OpenCL duplicates; SYCL device 0 = first unit
    return env


def _amd_env(
    units: Sequence[Unit], inventory: Inventory, parent_env: Mapping[str, str]
) -> dict[str, str | None]:
    env: dict[str, str | None] = {n: None for n in (HIP_VAR, GPU_ORDINAL_VAR) if n in parent_env}
    if not units:  # ROCr RvdFilter::SelectZeroDevices: set but empty surfaces zero devices
        env[ROCR_VAR] = ""
        return env
    from xpulaunch.core.masks.rocm import format_rocr_visible_devices

    env[ROCR_VAR] = format_rocr_visible_devices([u.device for u in units])
    _refuse_unknown_partitions(units, inventory.of(Vendor.AMD), env[ROCR_VAR] or "")
    if inventory.of(Vendor.NVIDIA):
        # HIP falls back to CUDA_VISIBLE_DEVICES when HIP_VISIBLE_DEVICES is empty, so hiding
        # the NVIDIA GPUs with CUDA_VISIBLE_DEVICES="" needs HIP pinned to all that ROCR
        # leaves (ROCm's "GPU isolation techniques": "set HIP_VISIBLE_DEVICES consistently relative
        # to it").
        env[HIP_VAR] = ",".join(str(i) for i in range(len(units)))
        env[CUDA_VAR] = ""
    elif CUDA_VAR in parent_env:
        env[CUDA_VAR] = None  # HIP would read it as a second mask (ollama hit this)
    return env
