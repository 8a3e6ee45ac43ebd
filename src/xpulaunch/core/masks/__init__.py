"""Parse and format each runtime's visibility variable, the way that runtime reads it.

Pure: a parser takes the variable's value (``None`` = unset) and the devices of the inventory,
and returns what the runtime would expose, in the runtime's order, with notes on anything
surprising. A value that would crash the runtime, or that the runtime refuses, raises
:class:`~xpulaunch.errors.MaskError` with one line naming the variable, the value and what
would be valid. Sources: compute-runtime (Level Zero), intel/llvm (SYCL), the CUDA
Programming Guide, ROCm's "GPU isolation techniques".

One module per runtime: :mod:`.cuda`, :mod:`.level_zero`, :mod:`.oneapi`, :mod:`.rocm`; every
public name is re-exported here.
"""

from __future__ import annotations

from xpulaunch.core.masks.common import (
    CUDA_VAR,
    HIP_VAR,
    ODS_VAR,
    ROCR_VAR,
    ZE_HIERARCHY_VAR,
    ZE_MASK_VAR,
)
from xpulaunch.core.masks.cuda import (
    CudaEntry,
    CudaVisible,
    format_cuda_visible_devices,
    parse_cuda_visible_devices,
)
from xpulaunch.core.masks.level_zero import (
    ZE_HIDE_ALL,
    ZeVisible,
    driver_order,
    format_ze_affinity_mask,
    parse_ze_affinity_mask,
    pci_id_order,
    refuse_doubtful_tiles,
    regroup_units,
    resolve_hierarchy,
)
from xpulaunch.core.masks.oneapi import OneApiFilter, RootPick, parse_oneapi_device_selector
from xpulaunch.core.masks.rocm import (
    AmdVisible,
    amd_visible,
    format_rocr_visible_devices,
    parse_hip_visible_devices,
    parse_rocr_visible_devices,
)

__all__ = [
    "CUDA_VAR",
    "HIP_VAR",
    "ODS_VAR",
    "ROCR_VAR",
    "ZE_HIERARCHY_VAR",
    "ZE_MASK_VAR",
    "CudaEntry",
    "CudaVisible",
    "format_cuda_visible_devices",
    "parse_cuda_visible_devices",
    "ZE_HIDE_ALL",
    "ZeVisible",
    "driver_order",
    "format_ze_affinity_mask",
    "parse_ze_affinity_mask",
    "pci_id_order",
    "refuse_doubtful_tiles",
    "regroup_units",
    "resolve_hierarchy",
    "OneApiFilter",
    "RootPick",
    "parse_oneapi_device_selector",
    "AmdVisible",
    "amd_visible",
    "format_rocr_visible_devices",
    "parse_hip_visible_devices",
    "parse_rocr_visible_devices",
]
