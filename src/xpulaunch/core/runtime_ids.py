"""Device ordinals in the numbering of the child's runtime (accelerate's ``gpu_ids``) -> units.

``accelerate launch`` does not map ``gpu_ids`` to devices itself: it writes them into the
children's mask variable and lets the runtime read them (``prepare_multi_gpu_env`` and
``prepare_simple_launcher_cmd_env`` in ``accelerate/utils/launch.py``: ``ZE_AFFINITY_MASK``
on XPU, ``CUDA_VISIBLE_DEVICES`` otherwise, replacing the parent's value). So ``gpu_ids: 0,1``
on 2x Max 1550 under FLAT (the driver default there) is flat devices 0 and 1: the two tiles of
card 0, and ``1,3`` is tile 1 of each card. Pure: each vendor's own mask model reads the ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpulaunch.core.masks import CUDA_VAR, HIP_VAR, ROCR_VAR, ZE_MASK_VAR, cuda, level_zero, rocm
from xpulaunch.core.selection import GpuMode, GpuRequest
from xpulaunch.errors import SelectionError
from xpulaunch.model import Hierarchy, Inventory, Unit, Vendor

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

PCI_ORDER_VAR = "ZE_ENABLE_PCI_ID_DEVICE_ORDER"


def runtime_units(
    ids: str,
    vendor: Vendor,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    hierarchy: Hierarchy | None,
) -> tuple[tuple[Unit, ...], str]:
    """The units a child given ``ids`` as its mask variable would see, and a note naming the
    variable and the numbering. ``hierarchy``: the Level Zero hierarchy of the children."""
    devices = inventory.of(vendor)
    if vendor is Vendor.INTEL:
        chosen = hierarchy or level_zero.resolve_hierarchy(None, devices)[0]
        pci_order = level_zero.pci_id_order(parent_env.get(PCI_ORDER_VAR))
        level_zero.refuse_doubtful_tiles(devices, chosen, "gpu_ids")
        units = level_zero.parse_ze_affinity_mask(ids, devices, chosen, pci_order=pci_order).units
        what = "flat tile indices" if chosen.hands_out_tiles else "card indices"
        return units, f"{ZE_MASK_VAR}={ids} under {chosen.value}: {what}"
    if vendor is Vendor.NVIDIA:
        entries = cuda.parse_cuda_visible_devices(ids, devices).entries
        units = tuple(Unit(e.device, mig=e.mig) for e in entries)
        return units, f"{CUDA_VAR}={ids}: nvidia-smi indices"
    # HIP reads CUDA_VISIBLE_DEVICES when HIP_VISIBLE_DEVICES is unset or empty, relative to
    # what the parent's ROCR_VISIBLE_DEVICES leaves (ROCm's "GPU isolation techniques").
    hip_name, hip = (HIP_VAR, parent_env[HIP_VAR]) if parent_env.get(HIP_VAR) else (CUDA_VAR, ids)
    seen = rocm.amd_visible(parent_env.get(ROCR_VAR), hip, devices, hip_name=hip_name)
    return tuple(Unit(d) for d in seen.devices), f"{hip_name}={hip}: ROCm agent indices"


def runtime_request(
    ids: str,
    vendor: Vendor,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    hierarchy: Hierarchy | None,
) -> tuple[GpuRequest, str]:
    """``gpu_ids`` as an explicit ``--gpus`` request of the units they name, with a note."""
    units, read_as = runtime_units(ids, vendor, inventory, parent_env, hierarchy)
    if not units:
        raise SelectionError(
            f"as accelerate launch's children read them ({read_as}) they name no device of "
            f"this host; {_valid(vendor, inventory, hierarchy)}",
            option="gpu_ids",
            value=ids,
        )
    note = (
        f"gpu_ids {ids} read as accelerate launch's children read them ({read_as}): "
        + ", ".join(u.label() for u in units)
    )
    return GpuRequest(GpuMode.EXPLICIT, ids=tuple(_our_id(u) for u in units)), note


def _our_id(unit: Unit) -> str:
    """The unit in ``--gpus`` syntax, vendor-qualified: ``intel:0.1``, a MIG UUID, ``nvidia:2``."""
    if unit.mig is not None:
        return unit.mig.uuid
    vendor = unit.device.vendor.value
    tile = "" if unit.tile is None else f".{unit.tile}"
    return f"{vendor}:{unit.device.index}{tile}"


def _valid(vendor: Vendor, inventory: Inventory, hierarchy: Hierarchy | None) -> str:
    devices: Sequence[object] = inventory.of(vendor)
    if vendor is Vendor.INTEL and hierarchy is not None and hierarchy.hands_out_tiles:
        count = sum(d.tiles for d in inventory.of(vendor))
        return f"valid: 0-{count - 1} (tiles, {hierarchy.value})" if count else "no Intel GPU"
    return f"valid: 0-{len(devices) - 1}" if devices else f"no {vendor.value} GPU"
