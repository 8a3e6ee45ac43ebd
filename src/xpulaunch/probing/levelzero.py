"""Level Zero Sysman through ``pyzes`` (Intel's ctypes binding), when it is importable.

Sysman enumerates physical cards and is not affected by the ``ZE_*`` selection variables
(zes_api.h). ``import pyzes`` loads ``libze_loader.so.1`` from a fixed
path and raises when it is absent, so it is imported only here, only when needed.
Sysman is a management API like NVML: it creates no compute context.
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Callable
from functools import partial
from typing import Any

from xpulaunch.model import Problem, Vendor
from xpulaunch.probing.observe import Observation

_INTEGRATED_FLAG = 1  # ZE_DEVICE_PROPERTY_FLAG_INTEGRATED = ZE_BIT(0)
_INTEL = 0x8086


class SysmanError(Exception):
    """A Sysman call that did not return ZE_RESULT_SUCCESS."""


def import_pyzes() -> tuple[Any, Problem | None]:
    try:
        return importlib.import_module("pyzes"), None
    except (ImportError, OSError) as exc:
        return None, Problem("pyzes", f"not importable: {exc}")


def probe_pyzes(zes: Any) -> tuple[list[Observation] | None, list[Problem]]:
    """Every Intel card Sysman reports: PCI address, name, tiles, device-local memory."""
    try:
        _check(zes, zes.zesInit(0), "zesInit")
        found = []
        for driver in _handles(zes, zes.zes_driver_handle_t, zes.zesDriverGet, "zesDriverGet"):
            devices = _handles(
                zes,
                zes.zes_device_handle_t,
                partial(zes.zesDeviceGet, driver),
                "zesDeviceGet",
            )
            found += [obs for obs in (_device(zes, dev) for dev in devices) if obs is not None]
    except SysmanError as exc:
        return None, [Problem("pyzes", str(exc))]
    return found, []


def _check(zes: Any, rc: int, call: str) -> None:
    if rc != zes.ZE_RESULT_SUCCESS:
        raise SysmanError(f"{call} returned 0x{rc & 0xFFFFFFFF:08x}")


def _handles(zes: Any, handle_type: Any, get: Callable[[Any, Any], int], call: str) -> list[Any]:
    """The two-call enumeration idiom: ask for the count, then fill an array of handles."""
    count = ctypes.c_uint32(0)
    _check(zes, get(ctypes.byref(count), None), call)
    array = (handle_type * count.value)()
    if count.value:
        _check(zes, get(ctypes.byref(count), array), call)
    return list(array[: count.value])


def _device(zes: Any, dev: Any) -> Observation | None:
    props = zes.zes_device_properties_t()
    props.stype = zes.ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES
    _check(zes, zes.zesDeviceGetProperties(dev, ctypes.byref(props)), "zesDeviceGetProperties")
    if props.core.vendorId != _INTEL:
        return None
    pci = zes.zes_pci_properties_t()
    pci.stype = zes.ZES_STRUCTURE_TYPE_PCI_PROPERTIES
    _check(zes, zes.zesDevicePciGetProperties(dev, ctypes.byref(pci)), "zesDevicePciGetProperties")
    a = pci.address
    total, free = _device_memory(zes, dev)
    return Observation(
        vendor=Vendor.INTEL,
        sources=("pyzes",),
        pci_bus_id=f"{a.domain & 0xFFFF:04x}:{a.bus:02x}:{a.device:02x}.{a.function:x}",
        name=_c_text(props.modelName) or None,
        integrated=bool(props.core.flags & _INTEGRATED_FLAG),
        tiles=max(int(props.numSubdevices), 1),
        memory_total_bytes=total,
        memory_used_bytes=None if total is None or free is None else max(total - free, 0),
        extra={"pci_device_id": f"0x{props.core.deviceId:04x}"},
    )


def _device_memory(zes: Any, dev: Any) -> tuple[int | None, int | None]:
    """Sum of device-local memory modules (one per tile on multi-tile cards): size, free."""
    modules = _handles(
        zes,
        zes.zes_mem_handle_t,
        partial(zes.zesDeviceEnumMemoryModules, dev),
        "zesDeviceEnumMemoryModules",
    )
    total = free = 0
    local = False
    for module in modules:
        props = zes.zes_mem_properties_t()
        props.stype = zes.ZES_STRUCTURE_TYPE_MEM_PROPERTIES
        _check(
            zes, zes.zesMemoryGetProperties(module, ctypes.byref(props)), "zesMemoryGetProperties"
        )
        if props.location != zes.ZES_MEM_LOC_DEVICE:
            continue
        state = zes.zes_mem_state_t()
        state.stype = zes.ZES_STRUCTURE_TYPE_MEM_STATE
        _check(zes, zes.zesMemoryGetState(module, ctypes.byref(state)), "zesMemoryGetState")
        total, free, local = total + int(state.size), free + int(state.free), True
    return (total, free) if local else (None, None)


def _c_text(value: object) -> str:
    raw = bytes(value) if isinstance(value, (bytes, bytearray)) else str(value).encode()
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace").strip()
