"""A stand-in for Intel's ``pyzes`` module (Level Zero Sysman ctypes binding).

The structures copy the field layout of oneapi-src/level-zero ``bindings/sysman/python/source/
pyzes.py``; the functions take ``byref(...)`` and arrays exactly like the ctypes wrappers there
and fill them as the NEO Sysman implementation would (reference section 2.7): discrete memory
``free``/``size`` per device-local module, one module per tile.
"""

from __future__ import annotations

from ctypes import (
    Structure,
    c_char,
    c_int32,
    c_int64,
    c_ubyte,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Any

ZE_RESULT_SUCCESS = 0
ZE_RESULT_ERROR_UNINITIALIZED = 0x78000001
ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES = 0x1
ZES_STRUCTURE_TYPE_PCI_PROPERTIES = 0x2
ZES_STRUCTURE_TYPE_MEM_PROPERTIES = 0xB
ZES_STRUCTURE_TYPE_MEM_STATE = 0x1E
ZES_MEM_LOC_SYSTEM = 0
ZES_MEM_LOC_DEVICE = 1
ZE_MAX_DEVICE_UUID_SIZE = 16
ZES_STRING_PROPERTY_SIZE = 64
ZE_MAX_DEVICE_NAME = 256


class zes_driver_handle_t(c_void_p):
    pass


class zes_device_handle_t(c_void_p):
    pass


class zes_mem_handle_t(c_void_p):
    pass


class ze_device_uuid_t(Structure):
    _fields_ = [("id", c_ubyte * ZE_MAX_DEVICE_UUID_SIZE)]


class ze_device_properties_t(Structure):
    _fields_ = [
        ("stype", c_int32), ("pNext", c_void_p), ("type", c_int32), ("vendorId", c_uint32),
        ("deviceId", c_uint32), ("flags", c_uint32), ("subdeviceId", c_uint32),
        ("coreClockRate", c_uint32), ("maxMemAllocSize", c_uint64),
        ("maxHardwareContexts", c_uint32), ("maxCommandQueuePriority", c_uint32),
        ("numThreadsPerEU", c_uint32), ("physicalEUSimdWidth", c_uint32),
        ("numEUsPerSubslice", c_uint32), ("numSubslicesPerSlice", c_uint32),
        ("numSlices", c_uint32), ("timerResolution", c_uint64), ("timestampValidBits", c_uint32),
        ("kernelTimestampValidBits", c_uint32), ("uuid", ze_device_uuid_t),
        ("name", c_char * ZE_MAX_DEVICE_NAME),
    ]  # fmt: skip


class zes_device_properties_t(Structure):
    _fields_ = [
        ("stype", c_int32), ("pNext", c_void_p), ("core", ze_device_properties_t),
        ("numSubdevices", c_uint32), ("serialNumber", c_char * ZES_STRING_PROPERTY_SIZE),
        ("boardNumber", c_char * ZES_STRING_PROPERTY_SIZE),
        ("brandName", c_char * ZES_STRING_PROPERTY_SIZE),
        ("modelName", c_char * ZES_STRING_PROPERTY_SIZE),
        ("vendorName", c_char * ZES_STRING_PROPERTY_SIZE),
        ("driverVersion", c_char * ZES_STRING_PROPERTY_SIZE),
    ]  # fmt: skip


class zes_pci_address_t(Structure):
    _fields_ = [("domain", c_uint32), ("bus", c_uint32), ("device", c_uint32),
                ("function", c_uint32)]  # fmt: skip


class zes_pci_speed_t(Structure):
    _fields_ = [("gen", c_int32), ("width", c_int32), ("maxBandwidth", c_int64)]


class zes_pci_properties_t(Structure):
    _fields_ = [
        ("stype", c_int32), ("pNext", c_void_p), ("address", zes_pci_address_t),
        ("maxSpeed", zes_pci_speed_t), ("haveBandwidthCounters", c_uint8),
        ("havePacketCounters", c_uint8), ("haveReplayCounters", c_uint8),
    ]  # fmt: skip


class zes_mem_properties_t(Structure):
    _fields_ = [
        ("stype", c_int32), ("pNext", c_void_p), ("type", c_int32), ("onSubdevice", c_uint8),
        ("subdeviceId", c_uint32), ("location", c_int32), ("physicalSize", c_uint64),
        ("busWidth", c_int32), ("numChannels", c_int32),
    ]  # fmt: skip


class zes_mem_state_t(Structure):
    _fields_ = [("stype", c_int32), ("pNext", c_void_p), ("health", c_int32),
                ("free", c_uint64), ("size", c_uint64)]  # fmt: skip


class FakePyzes:
    """Devices: dicts with ``bdf``, ``device_id``, ``name``, ``integrated``, ``subdevices``,
    ``modules`` (list of ``(location, size, free)``)."""

    def __init__(self, devices: list[dict[str, Any]], *, init_rc: int = ZE_RESULT_SUCCESS) -> None:
        self.devices = devices
        self.init_rc = init_rc
        self.initialised = False
        for name, value in globals().items():
            if name.startswith(("ZE", "zes_", "ze_")):
                setattr(self, name, value)

    def zesInit(self, flags: int) -> int:
        self.initialised = self.init_rc == ZE_RESULT_SUCCESS
        return self.init_rc

    def _fill(self, count_ref: Any, array: Any, items: list[Any], handle_type: Any) -> int:
        if not self.initialised:
            return ZE_RESULT_ERROR_UNINITIALIZED
        count = count_ref._obj
        if array is not None:
            for i in range(min(count.value, len(items))):
                array[i] = handle_type(items[i])
        count.value = len(items)
        return ZE_RESULT_SUCCESS

    def zesDriverGet(self, count_ref: Any, array: Any) -> int:
        return self._fill(count_ref, array, [0x1000], zes_driver_handle_t)

    def zesDeviceGet(self, driver: Any, count_ref: Any, array: Any) -> int:
        handles = [0x2000 + i for i in range(len(self.devices))]
        return self._fill(count_ref, array, handles, zes_device_handle_t)

    def _device(self, handle: Any) -> dict[str, Any]:
        return self.devices[handle.value - 0x2000]

    def zesDeviceGetProperties(self, handle: Any, props_ref: Any) -> int:
        d, props = self._device(handle), props_ref._obj
        props.core.vendorId = 0x8086
        props.core.deviceId = d["device_id"]
        props.core.flags = 1 if d["integrated"] else 0
        props.numSubdevices = d["subdevices"]
        props.modelName = d["name"].encode()
        return ZE_RESULT_SUCCESS

    def zesDevicePciGetProperties(self, handle: Any, pci_ref: Any) -> int:
        domain, bus, rest = self._device(handle)["bdf"].split(":")
        dev, fn = rest.split(".")
        address = pci_ref._obj.address
        address.domain, address.bus = int(domain, 16), int(bus, 16)
        address.device, address.function = int(dev, 16), int(fn)
        return ZE_RESULT_SUCCESS

    def zesDeviceEnumMemoryModules(self, handle: Any, count_ref: Any, array: Any) -> int:
        index = handle.value - 0x2000
        modules = [0x3000 + index * 16 + m for m in range(len(self.devices[index]["modules"]))]
        return self._fill(count_ref, array, modules, zes_mem_handle_t)

    def _module(self, handle: Any) -> tuple[int, int, int]:
        index, slot = divmod(handle.value - 0x3000, 16)
        location, size, free = self.devices[index]["modules"][slot]
        return location, size, free

    def zesMemoryGetProperties(self, handle: Any, props_ref: Any) -> int:
        location, size, _ = self._module(handle)
        props_ref._obj.location = location
        props_ref._obj.physicalSize = size
        return ZE_RESULT_SUCCESS

    def zesMemoryGetState(self, handle: Any, state_ref: Any) -> int:
        _, size, free = self._module(handle)
        state_ref._obj.size, state_ref._obj.free = size, free
        return ZE_RESULT_SUCCESS
