"""Wait until NVIDIA GPUs have released a dead worker's memory before reusing them.

The driver frees a killed process's VRAM asynchronously; a restart that allocates at once can
fail with out-of-memory (llama-swap issue #97, Unsloth's ``gpu_arbiter``). So
before a restart on CUDA the supervisor waits, bounded, until each device's used memory is
back near what it was before the job started. NVML answers without creating a CUDA context
(nvidia-ml-py), and ``pynvml`` is imported only here, only for CUDA plans.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from xpulaunch.model import Backend

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from types import ModuleType
    from typing import Any

    from xpulaunch.model import Plan

SLACK_BYTES = 256 * 1024 * 1024  # other tenants' small allocations are not ours to wait for


class NvmlSettle:
    """``settle(names)`` blocks until the devices of those workers are back to baseline.

    ``devices`` maps a worker name to the PCI addresses (or UUIDs) of its GPUs. Call
    :meth:`baseline` before the first start. Problems (no NVML, a device gone) end the wait
    early and are kept in :attr:`notes`, never raised: the restart goes on regardless.
    """

    def __init__(
        self,
        devices: Mapping[str, Sequence[str]],
        *,
        timeout_s: float = 10.0,
        poll_s: float = 0.1,
        nvml: ModuleType | Any | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._devices = {name: tuple(ids) for name, ids in devices.items()}
        self._timeout_s, self._poll_s = timeout_s, poll_s
        self._nvml = nvml
        self._clock, self._sleep = clock, sleep
        self._baseline: dict[str, int] = {}
        self.notes: list[str] = []

    def _lib(self) -> Any | None:
        """The NVML module, initialised; None (with a note) when there is none."""
        if self._nvml is None:
            try:
                import pynvml

                pynvml.nvmlInit()
            except ImportError as exc:
                self._failed(exc)
                return None
            except pynvml.NVMLError as exc:  # no driver, no permission
                self._failed(exc)
                return None
            self._nvml = pynvml
        return self._nvml

    def _used_bytes(self, nvml: Any, device_id: str) -> int:
        if device_id.startswith(("GPU-", "MIG-")):
            handle = nvml.nvmlDeviceGetHandleByUUID(device_id)
        else:
            handle = nvml.nvmlDeviceGetHandleByPciBusId(device_id)
        return int(nvml.nvmlDeviceGetMemoryInfo(handle).used)

    def _failed(self, exc: Exception) -> None:
        self.notes.append(f"cannot watch GPU memory through NVML: {exc}")

    def baseline(self) -> None:
        """Record each device's used memory before any worker of the job runs."""
        nvml = self._lib()
        if nvml is None:
            return
        try:
            for device_id in sorted({d for ids in self._devices.values() for d in ids}):
                self._baseline[device_id] = self._used_bytes(nvml, device_id)
        except nvml.NVMLError as exc:
            self._failed(exc)

    def __call__(self, names: Sequence[str]) -> None:
        pending = {d for n in names for d in self._devices.get(n, ()) if d in self._baseline}
        nvml = self._lib() if pending else None
        deadline = self._clock() + self._timeout_s
        while pending and nvml is not None:
            try:
                pending = {d for d in pending if self._used_bytes(nvml, d) > self._limit(d)}
            except nvml.NVMLError as exc:
                self._failed(exc)
                return
            if not pending:
                return
            if self._clock() >= deadline:
                held = ", ".join(sorted(pending))
                self.notes.append(f"GPU memory not released after {self._timeout_s:g} s: {held}")
                return
            self._sleep(self._poll_s)

    def _limit(self, device_id: str) -> int:
        return self._baseline[device_id] + SLACK_BYTES


def gpu_settle(plan: Plan) -> NvmlSettle | None:
    """For CUDA plans, the Supervisor's ``settle`` hook: before a restart, wait (bounded)
    until the workers' GPUs released their memory (NVML only, never torch). Call it before
    starting: it records each device's baseline."""
    if plan.backend is not Backend.CUDA:
        return None
    ids = [u.device.pci_bus_id or u.device.uuid or "" for u in plan.devices]
    devices = {w.name: [ids[i] for i in w.units or range(len(ids)) if ids[i]] for w in plan.workers}
    settle = NvmlSettle(devices)
    settle.baseline()
    return settle
