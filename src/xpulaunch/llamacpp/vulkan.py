"""Which ``VulkanN`` of ``llama-server --list-devices`` is which inventory device. Pure.

No vendor mask reaches Vulkan: ``CUDA_VISIBLE_DEVICES`` and ``ZE_AFFINITY_MASK`` act inside
CUDA and Level Zero, while the Vulkan drivers enumerate every GPU. So a
Vulkan replica is pinned with ``--device VulkanN`` . ``--list-devices`` prints
only ``VulkanN: <device name> (<total> MiB, <free> MiB free)``, no PCI address or UUID
(ggml-vulkan.cpp keeps the PCI id internally but common/arg.cpp does not print it), so we
match on what it does print:

1. the name: one name's words must all appear in the other (Mesa appends ``(DG2)`` or
   ``(RADV NAVI31)``; trade marks ``(R)``/``(TM)`` are spelled differently by each tool);
   without an inventory name, the vendor's word (``NVIDIA``, ``Intel``, ``AMD``/``Radeon``);
2. total memory within 10 % when both sides know it (the Vulkan heap is not always
   byte-identical to what NVML or sysfs report);
3. identical cards (same name and memory) are paired in order: the k-th such inventory device
   (physical index order, i.e. PCI order) gets the k-th such Vulkan device. Vulkan's order is
   loader-defined and not guaranteed to be PCI order (not verified on
   hardware), so the plan says when this rule decided.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from xpulaunch.errors import SelectionError
from xpulaunch.llamacpp.devices import LlamaDevice, describe
from xpulaunch.model import Device, Inventory, Unit, Vendor

MEMORY_TOLERANCE = 0.10
_MARKS = re.compile(r"\((?:r|tm|c)\)", re.IGNORECASE)
_VENDOR_WORDS = {
    Vendor.NVIDIA: {"nvidia"},
    Vendor.INTEL: {"intel"},
    Vendor.AMD: {"amd", "radeon"},
}


def _words(text: str) -> frozenset[str]:
    return frozenset(re.split(r"[^0-9a-z]+", _MARKS.sub(" ", text.lower()))) - {""}


def _same_name(device: Device, vulkan: LlamaDevice) -> bool:
    theirs = _words(vulkan.description)
    if device.name is None:
        return bool(_VENDOR_WORDS[device.vendor] & theirs)
    ours = _words(device.name)
    return bool(ours) and (ours <= theirs or theirs <= ours)


def _same_memory(device: Device, vulkan: LlamaDevice) -> bool:
    ours, theirs = device.memory_total_bytes, vulkan.memory_total_bytes
    if not ours or theirs is None:
        return True  # unknown is not a mismatch
    return abs(ours - theirs) <= MEMORY_TOLERANCE * ours


def match_devices(
    inventory: Inventory, vulkan: Sequence[LlamaDevice]
) -> tuple[dict[str, LlamaDevice], tuple[str, ...]]:
    """Inventory device key -> its Vulkan device, for every device that has one; and notes."""
    matched: dict[str, LlamaDevice] = {}
    notes: list[str] = []
    free = list(vulkan)
    for device in sorted(inventory.devices, key=lambda d: (d.vendor.value, d.index)):
        candidates = [v for v in free if _same_name(device, v) and _same_memory(device, v)]
        if not candidates:
            continue
        matched[device.key] = candidates[0]
        free.remove(candidates[0])
        if len(candidates) > 1:
            notes.append(
                f"{device.label()} -> {candidates[0].name}: {len(candidates)} Vulkan devices "
                f"look alike ({candidates[0].description}); paired in PCI order, assuming "
                "the Vulkan driver lists them that way (not verified on hardware)"
            )
    return matched, tuple(notes)


def replica_devices(
    units: Sequence[Unit], matched: dict[str, LlamaDevice], vulkan: Sequence[LlamaDevice]
) -> tuple[LlamaDevice, ...]:
    """The Vulkan devices of one replica: one per card (Vulkan sees whole cards, not tiles)."""
    for unit in units:
        if unit.device.key not in matched:
            raise SelectionError(
                f"{unit.device.label()} ({unit.device.name or 'unnamed'}): no Vulkan device "
                f"of llama-server --list-devices matches it (Vulkan lists: {describe(vulkan)}); "
                "pin one yourself with -- --device VulkanN"
            )
    return tuple(dict.fromkeys(matched[u.device.key] for u in units))
