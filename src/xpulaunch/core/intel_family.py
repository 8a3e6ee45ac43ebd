"""Which Intel cards are Data Center GPU Max (Xe-HPC, Ponte Vecchio), and their tile counts.

Pure. Level Zero's default hierarchy depends on the family, not on what a probe could count:
compute-runtime's ``GfxCoreHelper::getDefaultDeviceHierarchy`` returns FLAT for Xe-HPC, and
every Max part is Xe-HPC whatever its tile count. The ids are those compute-runtime registers
with ``PvcHwConfig`` (``shared/source/dll/devices/devices_base.inl``); the tile counts are
Intel's product specifications (Max 1550/1450/1350: two stacks; Max 1100: one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpulaunch.model import Device, Vendor

if TYPE_CHECKING:
    from collections.abc import Mapping

# PCI device id -> (marketing name, tiles); tiles None where no product name is published.
XE_HPC: Mapping[int, tuple[str, int | None]] = {
    0x0BD0: ("Intel(R) Data Center GPU Max", None),
    0x0BD4: ("Intel(R) Data Center GPU Max 1550VG", 2),
    0x0BD5: ("Intel(R) Data Center GPU Max 1550", 2),
    0x0BD6: ("Intel(R) Data Center GPU Max 1550", 2),
    0x0BD7: ("Intel(R) Data Center GPU Max 1350", 2),
    0x0BD8: ("Intel(R) Data Center GPU Max 1350", 2),
    0x0BD9: ("Intel(R) Data Center GPU Max 1100", 1),
    0x0BDA: ("Intel(R) Data Center GPU Max 1100", 1),
    0x0BDB: ("Intel(R) Data Center GPU Max 1100", 1),
    0x0B69: ("Intel(R) Data Center GPU Max 1450", 2),
    0x0B6E: ("Intel(R) Data Center GPU Max 1100C", 1),
}
_TILES_BY_NAME = {"1550": 2, "1450": 2, "1350": 2, "1100": 1}
# HBM2e per card (Intel's product specifications), to tell a whole card's memory from a tile's.
_MEMORY_GIB_BY_NAME = {"1550": 128, "1450": 128, "1350": 96, "1100": 48}
_MAX_NAME = "Data Center GPU Max"


def pci_device_id(device: Device) -> int | None:
    """The PCI device id the probe recorded (``extra["pci_device_id"]``, ``"0x0bd7"``)."""
    text = device.extra.get("pci_device_id")
    try:
        return int(text, 16) if isinstance(text, str) else None
    except ValueError:
        return None


def is_xe_hpc(device: Device) -> bool:
    """A Data Center GPU Max card: by PCI device id, else by its marketing name."""
    if device.vendor is not Vendor.INTEL:
        return False
    device_id = pci_device_id(device)
    if device_id is not None:
        return device_id in XE_HPC
    return _MAX_NAME in (device.name or "")


def expected_tiles(device: Device) -> int | None:
    """Tiles the product has, where the id or the name says; None when unknown."""
    device_id = pci_device_id(device)
    if device_id is not None and device_id in XE_HPC:
        return XE_HPC[device_id][1]
    name = device.name or ""
    return next((n for model, n in _TILES_BY_NAME.items() if f"Max {model}" in name), None)


def tiles_in_doubt(device: Device) -> bool:
    """A Max card whose recorded tile count may be wrong: it differs from the product's, or
    the product is unknown and only the fallback of one tile was recorded."""
    if not is_xe_hpc(device):
        return False
    expected = expected_tiles(device)
    return device.tiles <= 1 if expected is None else device.tiles != expected


def product_memory_bytes(name: str | None) -> int | None:
    """The memory of a Max card from its marketing name; None for other cards."""
    for model, gib in _MEMORY_GIB_BY_NAME.items():
        if f"Max {model}" in (name or ""):
            return gib * 1024**3
    return None


def reports_one_tile(lmem_total_bytes: int, name: str | None, tiles: int | None) -> bool:
    """Whether an i915 ``lmem_total_bytes`` covers tile 0 only: the 2023 ``ubuntu/main``
    backport sums the memory regions of the root tile alone, so a two-tile Max card shows
    about half of its memory."""
    product = product_memory_bytes(name)
    return bool(tiles and tiles > 1 and product and lmem_total_bytes < 0.75 * product)


# High bytes of Gen9 and Gen11 iGPU ids (Skylake 0x19, Apollo/Gemini Lake 0x5A/0x31, Kaby/
# Amber Lake 0x59/0x87, Coffee/Comet Lake 0x3E/0x9B, Ice Lake 0x8A, Elkhart/Jasper Lake 0x4E):
# compute-runtime serves them from its separate "legacy1" build since release 24.35.
_LEGACY_PREFIXES = frozenset({0x19, 0x5A, 0x31, 0x59, 0x87, 0x3E, 0x9B, 0x8A, 0x4E})


def needs_legacy_driver(device: Device) -> bool:
    device_id = pci_device_id(device)
    return device.integrated and device_id is not None and device_id >> 8 in _LEGACY_PREFIXES
