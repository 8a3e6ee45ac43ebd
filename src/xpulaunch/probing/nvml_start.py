"""Start NVML ahead of the probe, in a process that probes once and exits.

``nvmlInit`` and attaching each GPU is nearly all waiting in the driver, and importing the
probe's modules costs about as much again of interpreter time (``docs/BENCHMARKS.md`` has the
figures). :func:`start_nvml` runs the first in a thread while the caller does the
second (ctypes lets go of the GIL during a C call). The probe's own ``nvmlInit`` (pynvml loads
the same library) then finds NVML started and its GPUs attached. Only standard-library imports
here: this module is imported before the probe's.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

# What pynvml's nvmlInit loads on Linux (its _LoadNvmlLibrary).
NVML_LIBRARY = "libnvidia-ml.so.1"
# The testing hook that points the probe at a fake machine, where it leaves NVML alone
# (probing.host.probe_from_env): defined here, in the module imported first.
SYSFS_ROOT_ENV = "XPULAUNCH_SYSFS_ROOT"


def start_nvml(env: Mapping[str, str]) -> None:
    """Start NVML in a daemon thread, unless ``env`` describes a fake machine. For
    ``xpulaunch devices`` and the forked probe child, which probe once and exit: the thread's
    NVML reference ends with the process, so a long-lived process never calls this. Where the
    library does not load, or lacks NVML's calls, the thread ends at once and the probe says
    why NVML is not used, as before."""
    if not env.get(SYSFS_ROOT_ENV):
        threading.Thread(target=_start_nvml, name="xpulaunch-nvml-start", daemon=True).start()


def _start_nvml() -> None:
    import ctypes

    try:
        library = ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return
    with contextlib.suppress(AttributeError):
        attach_gpus(library)


def attach_gpus(library: Any) -> int:
    """``nvmlInit`` and each GPU's handle through ``library`` (NVML's C calls, as ctypes makes
    them); how many GPUs were attached (0 when NVML does not start)."""
    import ctypes

    count = ctypes.c_uint(0)
    if library.nvmlInit_v2() != 0 or library.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        return 0
    handle = ctypes.c_void_p()
    attached = 0
    for index in range(count.value):
        attached += library.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
    return attached
