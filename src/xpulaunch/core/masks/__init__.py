"""Parse and format each runtime's visibility variable, the way that runtime reads it.

Pure: a parser takes the variable's value (``None`` = unset) and the devices of the inventory,
and returns what the runtime would expose, in the runtime's order, with notes on anything
surprising. A value that would crash the runtime, or that the runtime refuses, raises
:class:`~xpulaunch.errors.MaskError` with one line naming the variable, the value and what
would be valid. Reference: ``device-semantics.md`` sections 2.1, 2.2, 2.4, 4.1, 5.1 and
pitfalls 4-8.

One module per runtime: :mod:`.cuda`, :mod:`.level_zero`, :mod:`.oneapi`, :mod:`.rocm`. Every
public name is re-exported here, but a vendor's module is only loaded when one of its names is
first used (PEP 562), so that planning for an NVIDIA host does not load the Level Zero, oneAPI
and ROCm parsers (issue 2: ``run --dry-run`` start-up time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpulaunch._lazy import exports
from xpulaunch.core.masks.common import (
    CUDA_VAR,
    HIP_VAR,
    ODS_VAR,
    ROCR_VAR,
    ZE_HIERARCHY_VAR,
    ZE_MASK_VAR,
)

if TYPE_CHECKING:
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
        regroup_units,
        resolve_hierarchy,
    )
    from xpulaunch.core.masks.oneapi import OneApiFilter, parse_oneapi_device_selector
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
    "regroup_units",
    "resolve_hierarchy",
    "OneApiFilter",
    "parse_oneapi_device_selector",
    "AmdVisible",
    "amd_visible",
    "format_rocr_visible_devices",
    "parse_hip_visible_devices",
    "parse_rocr_visible_devices",
]

# Each lazily loaded name -> the module of this package that defines it.
_LAZY = {
    "CudaEntry": "cuda",
    "CudaVisible": "cuda",
    "format_cuda_visible_devices": "cuda",
    "parse_cuda_visible_devices": "cuda",
    "ZE_HIDE_ALL": "level_zero",
    "ZeVisible": "level_zero",
    "driver_order": "level_zero",
    "format_ze_affinity_mask": "level_zero",
    "parse_ze_affinity_mask": "level_zero",
    "regroup_units": "level_zero",
    "resolve_hierarchy": "level_zero",
    "OneApiFilter": "oneapi",
    "parse_oneapi_device_selector": "oneapi",
    "AmdVisible": "rocm",
    "amd_visible": "rocm",
    "format_rocr_visible_devices": "rocm",
    "parse_hip_visible_devices": "rocm",
    "parse_rocr_visible_devices": "rocm",
}

__getattr__, __dir__ = exports(
    globals(), {name: f"{__name__}.{module}" for name, module in _LAZY.items()}
)
