"""Which processes use which GPU: NVML's compute processes, DRM fdinfo for i915/xe/amdgpu.

DRM fdinfo needs no root for one's own processes (the kernel checks ptrace access, as for
/proc/PID/environ); other users' processes are counted as unreadable, so a sum over the
readable ones is a complete reading only when none was unreadable.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xpulaunch.model import Device, Problem, Vendor
from xpulaunch.probing.parsers.fdinfo import DrmClient, parse_fdinfo


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process using one device."""

    pid: int
    device_key: str
    memory_bytes: int | None
    source: str  # "nvml" or "fdinfo"
    user: str | None = None
    command: str | None = None
    job_id: str | None = None  # XPULAUNCH_JOB_ID of its environment, where readable
    environ_read: bool = False  # its environment was readable: no job_id means none


@dataclass(frozen=True, slots=True)
class DrmScan:
    processes: tuple[GpuProcess, ...]
    unreadable: int  # processes whose fdinfo could not be read (another user's, without root)


def scan_drm(proc_root: str, keys: Mapping[str, str]) -> DrmScan:
    """Every process with an open DRM client on one of the devices ``keys`` maps (PCI
    address -> the device's key)."""
    found: list[GpuProcess] = []
    unreadable = 0
    for pid in _pids(proc_root):
        clients = _clients(proc_root, pid)
        if clients is None:
            unreadable += 1
            continue
        for bus, memory in _per_device(clients).items():
            if bus in keys:
                found.append(_described(proc_root, GpuProcess(pid, keys[bus], memory, "fdinfo")))
    return DrmScan(tuple(found), unreadable)


def _pids(proc_root: str) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(proc_root) if n.isdigit())
    except OSError:
        return []


def _clients(proc_root: str, pid: int) -> list[DrmClient] | None:
    """The DRM clients of ``pid``; None when its fdinfo cannot be read (not gone: empty)."""
    fdinfo = os.path.join(proc_root, str(pid), "fdinfo")
    try:
        names = os.listdir(fdinfo)
    except PermissionError:
        return None
    except OSError:
        return []
    clients = []
    for name in names:
        try:
            with open(os.path.join(fdinfo, name), encoding="ascii", errors="replace") as handle:
                client = parse_fdinfo(handle.read())
        except OSError:
            continue
        if client is not None:
            clients.append(client)
    return clients


def _per_device(clients: Iterable[DrmClient]) -> dict[str, int | None]:
    """Device memory per PCI address, each DRM client counted once (fds may share one)."""
    seen: dict[tuple[str, str], int | None] = {}
    for client in clients:
        seen.setdefault((client.pci_bus_id, client.client_id), client.device_memory_bytes)
    totals: dict[str, int | None] = {}
    for (bus, _), memory in seen.items():
        known = [m for m in (totals.get(bus), memory) if m is not None]
        totals[bus] = sum(known) if known else None
    return totals


def _described(proc_root: str, process: GpuProcess) -> GpuProcess:
    base = os.path.join(proc_root, str(process.pid))
    command = _read(os.path.join(base, "cmdline"))
    environ = _read(os.path.join(base, "environ"))
    job = None
    for item in (environ or "").split("\0"):
        if item.startswith("XPULAUNCH_JOB_ID="):
            job = item.partition("=")[2]
    return GpuProcess(
        process.pid,
        process.device_key,
        process.memory_bytes,
        process.source,
        _owner(base),
        (command or "").replace("\0", " ").strip() or None,
        job,
        environ is not None,
    )


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return None


def _owner(path: str) -> str | None:
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def nvml_processes(
    nvml: Any, devices: Sequence[Device], proc_root: str
) -> tuple[list[GpuProcess], list[Problem]]:
    """NVML's compute processes of each NVIDIA device, joined on its PCI address."""
    keys = {d.pci_bus_id: d.key for d in devices if d.vendor is Vendor.NVIDIA and d.pci_bus_id}
    found: list[GpuProcess] = []
    problems: list[Problem] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            bus = _nvml_bus(nvml.nvmlDeviceGetPciInfo(handle))
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError as exc:
            problems.append(Problem("nvml", f"device {index}: processes unknown: {exc}"))
            continue
        for entry in running:
            memory = getattr(entry, "usedGpuMemory", None)
            process = GpuProcess(int(entry.pid), keys.get(bus, bus), memory, "nvml")
            found.append(_described(proc_root, process))
    return found, problems


def _nvml_bus(info: Any) -> str:
    from xpulaunch.core.device_ids import normalize_bus_id

    raw = info.busId.decode() if isinstance(info.busId, bytes) else str(info.busId)
    return normalize_bus_id(raw) or raw


def gpu_processes(
    devices: Sequence[Device], *, proc_root: str = "/proc", nvml_module: Any = None
) -> tuple[list[GpuProcess], list[Problem]]:
    """Every process using one of ``devices``, and what could not be seen."""
    found: list[GpuProcess] = []
    problems: list[Problem] = []
    nvidia = [d for d in devices if d.vendor is Vendor.NVIDIA]
    if nvidia:
        nvml = _nvml(nvml_module, problems)
        if nvml is not None:
            more, trouble = nvml_processes(nvml, nvidia, proc_root)
            found += more
            problems += trouble
    others = [d for d in devices if d.vendor is not Vendor.NVIDIA]
    if others:
        scan = scan_drm(proc_root, {d.pci_bus_id: d.key for d in others if d.pci_bus_id})
        found += scan.processes
        if scan.unreadable:
            problems.append(Problem("fdinfo", unreadable_note(scan.unreadable)))
    return found, problems


def unreadable_note(count: int) -> str:
    return (
        f"the fdinfo of {count} process(es) was not readable (other users' processes need "
        "root): Intel and AMD lists show only what could be read"
    )


def _nvml(module: Any, problems: list[Problem]) -> Any:
    from xpulaunch.probing.nvidia import NVML_STATE, load_nvml

    nvml = module if module is not None else load_nvml()
    if nvml is None:
        problems.append(Problem("nvml", "not available: NVIDIA processes unknown"))
        return None
    try:
        NVML_STATE.init(nvml)
    except nvml.NVMLError as exc:
        problems.append(Problem("nvml", f"nvmlInit failed: {exc}"))
        return None
    return nvml


def drm_memory_in_use(proc_root: str, buses: Sequence[str]) -> dict[str, int] | None:
    """Device memory in use per PCI address, summed over every DRM client of the host; None
    unless every process's fdinfo could be read (then the sum is the whole truth)."""
    scan = scan_drm(proc_root, {bus: bus for bus in buses})
    if scan.unreadable:
        return None
    used = dict.fromkeys(buses, 0)
    for process in scan.processes:
        if process.memory_bytes is None:
            return None
        used[process.device_key] += process.memory_bytes
    return used
