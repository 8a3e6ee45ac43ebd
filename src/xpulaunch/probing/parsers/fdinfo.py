"""DRM client usage from ``/proc/PID/fdinfo/FD`` (the kernel's drm-usage-stats.rst).

One open DRM file of a process shows ``drm-driver``, ``drm-pdev`` (the PCI address),
``drm-client-id`` (several fds may share one client) and memory per region:
``drm-total-<region>`` and ``drm-resident-<region>`` (i915: ``local0``, ``system0``; xe and
amdgpu: ``vram0``/``vram``, ``gtt``), or amdgpu's older ``drm-memory-vram``. Values are
``<n> [KiB|MiB]``. Device memory is the ``local*``/``vram*`` regions; the rest is host memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from xpulaunch.core.device_ids import normalize_bus_id

_UNITS = {"": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_DEVICE_REGIONS = ("local", "vram")


@dataclass(frozen=True, slots=True)
class DrmClient:
    driver: str
    pci_bus_id: str
    client_id: str
    device_memory_bytes: int | None  # resident if reported, else total; None = not reported


def parse_fdinfo(text: str) -> DrmClient | None:
    """One fdinfo file -> the DRM client it shows; None for a file that is not a DRM client."""
    pairs = (line.partition(":") for line in text.splitlines())
    fields = {name.strip(): value.strip() for name, sep, value in pairs if sep}
    bus = normalize_bus_id(fields.get("drm-pdev", ""))
    if "drm-driver" not in fields or bus is None:
        return None
    return DrmClient(
        driver=fields["drm-driver"],
        pci_bus_id=bus,
        client_id=fields.get("drm-client-id", ""),
        device_memory_bytes=_device_memory(fields),
    )


def _device_memory(fields: dict[str, str]) -> int | None:
    for kind in ("drm-resident-", "drm-total-", "drm-memory-"):
        sizes = [
            _bytes(value)
            for name, value in fields.items()
            if name.startswith(kind) and name[len(kind) :].startswith(_DEVICE_REGIONS)
        ]
        known = [s for s in sizes if s is not None]
        if known:
            return sum(known)
    return None


def _bytes(value: str) -> int | None:
    number, _, unit = value.partition(" ")
    scale = _UNITS.get(unit.strip())
    if not number.isdigit() or scale is None:
        return None
    return int(number) * scale
