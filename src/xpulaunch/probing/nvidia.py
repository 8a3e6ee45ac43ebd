"""NVIDIA: NVML, else ``nvidia-smi --query-gpu``, else ``/proc/driver/nvidia`` for identity.

NVML (module ``pynvml`` from nvidia-ml-py) creates no CUDA context, so it is safe in the
launcher process, and it answers in-process; nvidia-smi is a process per call and is the
fallback. Both ignore ``CUDA_VISIBLE_DEVICES`` and number GPUs by the NVML index, which is
the contract's physical index.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import replace
from typing import TYPE_CHECKING

from xpulaunch.core.device_ids import normalize_bus_id
from xpulaunch.model import MigDevice, Problem, Vendor
from xpulaunch.probing.context import (
    ProbeContext,
    VendorResult,
    failed,
    not_installed,
    parsed_run,
    run_tool,
)
from xpulaunch.probing.nvml_start import NVML_LIBRARY
from xpulaunch.probing.observe import Observation
from xpulaunch.probing.parsers.nvidia import (
    NO_DEVICES_EXIT,
    NO_DEVICES_TEXT,
    QUERY_ARGV,
    QUERY_FIELDS,
    parse_proc_information,
    parse_query_gpu,
)
from xpulaunch.probing.sysfs import PciGpu

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from xpulaunch.model import Device

_Found = tuple[list[Observation] | None, list[Problem], bool]  # (devices, problems, absent)


def probe_nvidia(ctx: ProbeContext, pci: list[PciGpu] | None) -> VendorResult:
    """NVIDIA GPUs through the first source that works; earlier failures become problems.

    ``pci`` is the sysfs walk (``None`` when sysfs could not be read). When sysfs shows no NVIDIA
    GPU, a missing NVML library is the expected state of the host, not a problem.
    """
    listed = None if pci is None else [g for g in pci if g.vendor is Vendor.NVIDIA]
    result = VendorResult()
    sources: list[Callable[[], _Found]] = [lambda: _from_nvml(ctx)] if ctx.use_nvml else []
    sources += [lambda: _from_nvidia_smi(ctx), lambda: _from_procfs(ctx)]
    for source in sources:
        found, problems, absent = source()
        if found is not None and (found or not listed):
            if found:
                result.problems += problems  # what the working source could not measure
            else:
                result.notes += problems  # e.g. "No devices were found" on a host without any
            result.observations = _reconcile(found, listed, result)
            return result
        if listed or (listed is None and not absent):
            result.problems += problems
        else:
            result.notes += problems
        if listed == [] and absent:
            return result  # no NVIDIA stack and no NVIDIA board in sysfs: nothing to learn
    if listed:
        result.observations = _from_sysfs(listed, result)
    return result


def _reconcile(
    found: list[Observation], listed: list[PciGpu] | None, result: VendorResult
) -> list[Observation]:
    """Add sysfs facts (driver, device id) to each GPU; a GPU only sysfs sees is a problem."""
    by_bus = {g.bus_id: g for g in listed or []}
    merged = []
    for obs in found:
        gpu = by_bus.pop(obs.pci_bus_id, None) if obs.pci_bus_id else None
        merged.append(obs if gpu is None else _with_pci(obs, gpu))
    source = "/".join(found[0].sources) if found else "nvml"
    for gpu in by_bus.values():
        why = f"{gpu.describe()} (driver {gpu.driver or 'none'}) is not listed; not usable here"
        result.problems.append(Problem(source, why, device=gpu.bus_id))
    return merged


def _with_pci(obs: Observation, gpu: PciGpu) -> Observation:
    extra = {**gpu.facts(), **obs.extra}
    return replace(obs, sources=("sysfs", *obs.sources), extra=extra)


def _from_sysfs(listed: list[PciGpu], result: VendorResult) -> list[Observation]:
    """Last resort: PCI identity only, numbered in PCI order (NVML's order in practice)."""
    usable = [g for g in listed if g.driver == "nvidia"]
    result.problems += [g.skipped() for g in listed if g.driver != "nvidia"]
    return [
        _with_pci(Observation(Vendor.NVIDIA, (), pci_bus_id=g.bus_id, integrated=False, tiles=1), g)
        for g in usable
    ]


def _from_nvidia_smi(ctx: ProbeContext) -> _Found:
    run = run_tool(ctx, QUERY_ARGV)
    if run is None:
        return None, [not_installed("nvidia-smi")], True
    if isinstance(run, Problem):
        return None, [run], False
    if run.returncode == NO_DEVICES_EXIT and NO_DEVICES_TEXT in run.stdout + run.stderr:
        return [], [Problem("nvidia-smi", f"{NO_DEVICES_TEXT} (exit {NO_DEVICES_EXIT})")], False
    if run.returncode != 0:
        return None, [failed(run, "nvidia-smi")], False
    found = parse_query_gpu(run.stdout, QUERY_FIELDS)
    if not found:
        problem = Problem("nvidia-smi", f"no GPU rows in its output: {run.first_line()!r}")
        return None, [problem], False
    mig = "MIG is enabled; MIG instances are only listed through NVML"
    migs = [o.key for o in found if o.extra.get("mig_mode") == "Enabled"]
    problems = [Problem("nvidia-smi", mig, device=key) for key in migs]
    if ctx.read_topology and len(found) > 1:
        found = _with_topo(ctx, found, problems)
    return found, problems, False


def _with_topo(
    ctx: ProbeContext, found: list[Observation], problems: list[Problem]
) -> list[Observation]:
    """The links of ``nvidia-smi topo -m``, where NVML is not usable (a problem if it fails)."""
    from xpulaunch.probing.nvlink import TOPO_ARGV, with_topo_matrix
    from xpulaunch.probing.parsers.topology import parse_nvidia_topo

    topology = parsed_run(ctx, TOPO_ARGV, parse_nvidia_topo, "nvidia-smi topo")
    if isinstance(topology, Problem):
        problems.append(topology)
    return (
        found
        if topology is None or isinstance(topology, Problem)
        else with_topo_matrix(found, topology)
    )


def _from_procfs(ctx: ProbeContext) -> _Found:
    gpus_dir = os.path.join(ctx.proc_root, "driver", "nvidia", "gpus")
    try:
        entries = [os.path.join(gpus_dir, name) for name in sorted(os.listdir(gpus_dir))]
    except FileNotFoundError:
        return None, [], True
    except OSError as exc:
        return None, [Problem("procfs", f"cannot list {gpus_dir}: {exc.strerror or exc}")], False
    found, problems = [], []
    for entry in entries:
        try:
            with open(os.path.join(entry, "information")) as handle:
                found.append(parse_proc_information(handle.read()))
        except OSError as exc:
            problems.append(
                Problem("procfs", f"cannot read {entry}/information: {exc.strerror or exc}")
            )
    return (found or None), problems, False


# --- NVML ---------------------------------------------------------------------------------


def _from_nvml(ctx: ProbeContext) -> _Found:
    if ctx.nvml_module is None and not _library_loads():
        return None, [_no_nvml()], True
    nvml: Any = ctx.nvml_module if ctx.nvml_module is not None else _import_pynvml()
    if nvml is None:
        return None, [Problem("nvml", _NOT_IMPORTABLE)], True
    try:
        NVML_STATE.init(nvml)
    except nvml.NVMLError as exc:
        # No library or no kernel driver is the normal state of a host without NVIDIA GPUs.
        absent = exc.value in (nvml.NVML_ERROR_LIBRARY_NOT_FOUND, nvml.NVML_ERROR_DRIVER_NOT_LOADED)
        return None, [Problem("nvml", f"nvmlInit failed: {exc}")], absent
    problems: list[Problem] = []
    found = None
    try:
        found = _nvml_devices(nvml, problems, topology=ctx.read_topology)
    except nvml.NVMLError as exc:
        problems.append(Problem("nvml", f"query failed: {exc}"))
    return found, problems, False


class NvmlState:
    """The NVML modules this process has initialised: the one piece of process-wide state in
    the probe, and the one function that resets it (:meth:`shutdown`).

    NVML stays initialised once a probe used it: it holds no GPU context or memory, process
    exit releases it, and a long-lived supervisor probes again without paying nvmlShutdown and
    nvmlInit each time (docs/BENCHMARKS.md has the cost). The modules themselves are held, not
    their ``id()``: an id is reused once its object is freed, and a new stand-in module at a
    freed one's address would pass for initialised. Two threads may both initialise a module;
    pynvml counts its nvmlInit calls, and :meth:`shutdown` answers each with one nvmlShutdown.
    """

    def __init__(self) -> None:
        self._initialised: list[Any] = []

    def init(self, nvml: Any) -> None:
        """``nvml.nvmlInit()`` unless this process already did it; raises what it raises."""
        if not any(module is nvml for module in self._initialised):
            nvml.nvmlInit()
            self._initialised.append(nvml)

    def shutdown(self) -> None:
        """Shut down every module initialised here and forget it, leaving the process as if it
        had never probed (tests reset it between tests). A module already shut down by its
        owner is fine."""
        initialised, self._initialised = self._initialised, []
        for nvml in reversed(initialised):
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()


NVML_STATE = NvmlState()


# What pynvml's nvmlInit says when its library does not load.
_NO_LIBRARY = "nvmlInit failed: NVML Shared Library Not Found"
_NOT_IMPORTABLE = "pynvml (nvidia-ml-py) is not importable"


def _library_loads() -> bool:
    """Whether the NVML library can be loaded, asked without importing pynvml.

    A host without the NVIDIA driver should neither pay for nor fail on pynvml: importing it
    (with ctypes.util, shutil and tempfile) only for nvmlInit to fail to load the library is
    wasted work on every launch. Loading the library answers the same question, and where it
    loads, pynvml's own load of it then only takes another reference.
    """
    import ctypes

    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return False
    return True


def _no_nvml() -> Problem:
    """What the NVML source reports on a host without the library, pynvml installed or not
    (the texts of :func:`_from_nvml`'s own paths; tests/probe compare them with pynvml's)."""
    import importlib.util

    found = importlib.util.find_spec("pynvml") is not None
    return Problem("nvml", _NO_LIBRARY if found else _NOT_IMPORTABLE)


def load_nvml() -> Any:
    """pynvml where the NVML library loads; None otherwise (no import on hosts without it)."""
    return _import_pynvml() if _library_loads() else None


def _import_pynvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _nvml_devices(nvml: Any, problems: list[Problem], *, topology: bool) -> list[Observation]:
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    found = []
    handles: list[Any] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        obs = _nvml_device(nvml, index, problems, handles)
        if obs is not None:
            found.append(replace(obs, extra={"driver_version": driver}))
    if topology and found:
        from xpulaunch.probing.nvlink import with_nvml_topology

        found = with_nvml_topology(nvml, found, handles, problems)
    return found


def _nvml_device(
    nvml: Any, index: int, problems: list[Problem], handles: list[Any]
) -> Observation | None:
    """GPU ``index``; its handle is appended to ``handles`` (the topology read's)."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        bus_id = normalize_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        name = _text(nvml.nvmlDeviceGetName(handle))
    except nvml.NVMLError as exc:
        problems.append(Problem("nvml", f"GPU {index} cannot be queried: {exc}"))
        return None
    handles.append(handle)
    where = bus_id or uuid
    total, used = _nvml_memory(nvml, handle, where, problems)
    return Observation(
        vendor=Vendor.NVIDIA,
        sources=("nvml",),
        index=index,
        uuid=uuid,
        pci_bus_id=bus_id,
        name=name,
        integrated=False,
        tiles=1,
        memory_total_bytes=total,
        memory_used_bytes=used,
        utilization_percent=_nvml_utilization(nvml, handle, where, problems),
        mig_devices=_nvml_migs(nvml, handle, where, problems),
    )


def _nvml_memory(
    nvml: Any, handle: Any, where: str, problems: list[Problem]
) -> tuple[int | None, int | None]:
    """Total and used bytes, used WITHOUT the driver reserve.

    v1 ``used`` includes the reserve (644939776 bytes on an idle H200); v2 splits it out into
    ``reserved`` (NVML's ``nvmlMemory_v2_t``). Drivers without v2 fall back to v1, said so.
    """
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        return int(info.total), int(info.used)
    except nvml.NVMLError as exc:
        v2_error = exc
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
    except nvml.NVMLError as exc:
        problems.append(Problem("nvml", f"memory info unavailable: {exc}", where))
        return None, None
    why = f"memory info v2 unavailable ({v2_error}); used memory includes the driver reserve"
    problems.append(Problem("nvml", why, where))
    return int(info.total), int(info.used)


def _nvml_utilization(nvml: Any, handle: Any, where: str, problems: list[Problem]) -> float | None:
    try:
        return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError as exc:
        # "Not Supported" is NVML's documented answer for some boards and for MIG mode: unknown.
        if exc.value != nvml.NVML_ERROR_NOT_SUPPORTED:
            problems.append(Problem("nvml", f"utilisation unavailable: {exc}", where))
        return None


def nvml_sensors(
    nvml: Any, devices: Sequence[Device]
) -> tuple[dict[str, dict[str, float]], list[Problem]]:
    """Each NVIDIA device's ``temperature_celsius`` (the GPU die) and ``power_watts`` (NVML
    gives milliwatts), by device key, where the board reports them ("Not Supported" leaves
    one out, as for utilisation). Not part of the probe, which a launch pays for: the
    sampler of ``xpulaunch top`` asks, with NVML already open."""
    keys = {d.pci_bus_id: d.key for d in devices if d.vendor is Vendor.NVIDIA and d.pci_bus_id}
    found: dict[str, dict[str, float]] = {}
    problems: list[Problem] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            bus = normalize_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        except nvml.NVMLError as exc:
            problems.append(Problem("nvml", f"GPU {index}: sensors unknown: {exc}"))
            continue
        if bus in keys:
            found[keys[bus]] = _sensors(nvml, handle, bus, problems)
    return found, problems


def _sensors(nvml: Any, handle: Any, where: str, problems: list[Problem]) -> dict[str, float]:
    readings: dict[str, float] = {}
    asks = (
        ("temperature_celsius", nvml.nvmlDeviceGetTemperature, (nvml.NVML_TEMPERATURE_GPU,), 1.0),
        ("power_watts", nvml.nvmlDeviceGetPowerUsage, (), 1e-3),
    )
    for key, ask, args, scale in asks:
        try:
            readings[key] = round(float(ask(handle, *args)) * scale, 1)
        except nvml.NVMLError as exc:
            if exc.value != nvml.NVML_ERROR_NOT_SUPPORTED:
                problems.append(Problem("nvml", f"{key.split('_')[0]} unavailable: {exc}", where))
    return readings


def _nvml_migs(
    nvml: Any, handle: Any, where: str, problems: list[Problem]
) -> tuple[MigDevice, ...]:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError as exc:
        if exc.value != nvml.NVML_ERROR_NOT_SUPPORTED:  # not a MIG-capable GPU
            problems.append(Problem("nvml", f"MIG mode unavailable: {exc}", where))
        return ()
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        return ()
    migs = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            uuid = _text(nvml.nvmlDeviceGetUUID(mig))
        except nvml.NVMLError as exc:
            if exc.value != nvml.NVML_ERROR_NOT_FOUND:  # an empty slot is NOT_FOUND
                problems.append(Problem("nvml", f"MIG slot {slot}: {exc}", where))
            continue
        total, used = _nvml_memory(nvml, mig, uuid, problems)
        migs.append(MigDevice(uuid=uuid, memory_total_bytes=total, memory_used_bytes=used))
    return tuple(migs)


def _text(value: object) -> str:
    """nvidia-ml-py returns ``str``; very old pynvml returned ``bytes``."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
