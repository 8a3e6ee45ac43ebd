"""``probe_host``: walk sysfs once, then ask each vendor's sources in parallel threads.

No GPU runtime is touched here: NVML and Sysman are management libraries that create no
compute context, the vendor tools run as child processes, and ``torch.xpu`` (opt-in) runs in a
throw-away interpreter (a process that initialised a GPU runtime cannot fork a child that
uses it). The result is the inventory document of docs/CONTRACT.md, section 3, with
every failed source recorded as a problem.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from xpulaunch.model import Device, Inventory, Vendor
from xpulaunch.probing.context import ProbeContext, VendorResult, parallel
from xpulaunch.probing.drivers import (
    kernel_driver_version,
    legacy_level_zero_installed,
    level_zero_version,
)
from xpulaunch.probing.numa import TOPOLOGY_KEY, read_cpu_topology
from xpulaunch.probing.nvml_start import SYSFS_ROOT_ENV
from xpulaunch.probing.observe import to_devices
from xpulaunch.probing.runner import SubprocessRunner
from xpulaunch.probing.sysfs import list_pci_gpus, perfmon_capable

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from xpulaunch.probing.runner import Runner
    from xpulaunch.probing.sysfs import PciGpu

    _VendorProbe = Callable[[ProbeContext, list[PciGpu] | None], VendorResult]

# Testing hooks: point the CLI's probe at a fake machine (a sysfs/procfs tree built by a test).
# A fake machine has no real NVML or Sysman, so with a fake sysfs root both are switched off
# (SYSFS_ROOT_ENV comes from nvml_start, which follows the same rule before this is imported).
PROCFS_ROOT_ENV = "XPULAUNCH_PROCFS_ROOT"

_ORDER = {Vendor.NVIDIA: "vendor", Vendor.INTEL: "discrete", Vendor.AMD: "pci"}


# Vendor modules are imported only for vendors that are probed: on an NVIDIA-only host the
# Intel and AMD code (and ctypes for pyzes) is never loaded.
def _nvidia(ctx: ProbeContext, pci: list[PciGpu] | None) -> VendorResult:
    from xpulaunch.probing.nvidia import probe_nvidia

    return probe_nvidia(ctx, pci)


def _intel(ctx: ProbeContext, pci: list[PciGpu] | None) -> VendorResult:
    from xpulaunch.probing.intel import probe_intel

    return probe_intel(ctx, pci)


def _amd(ctx: ProbeContext, pci: list[PciGpu] | None) -> VendorResult:
    from xpulaunch.probing.amd import probe_amd

    return probe_amd(ctx, pci)


_PROBES: tuple[tuple[Vendor, _VendorProbe], ...] = (
    (Vendor.NVIDIA, _nvidia),
    (Vendor.INTEL, _intel),
    (Vendor.AMD, _amd),
)


def probe_host(
    *,
    sys_root: str | os.PathLike[str] = "/sys",
    proc_root: str | os.PathLike[str] = "/proc",
    runner: Runner | None = None,
    env: Mapping[str, str] | None = None,
    use_nvml: bool = True,
    use_pyzes: bool = True,
    use_torch: bool = False,
    timeout_s: float = 5.0,
    report_missing: bool = False,
    nvml_module: object | None = None,
    pyzes_module: object | None = None,
    torch_python: str | None = None,
    read_topology: bool = True,
) -> Inventory:
    """Every NVIDIA, Intel and AMD GPU of this host, with what could not be measured.

    Args:
        sys_root, proc_root: where sysfs and procfs are mounted (fake trees in tests).
        runner: runs vendor tools (default: real subprocesses).
        env: environment the tools start from (default: a copy of ``os.environ``); GPU
            selection variables are removed for tools that would honour them.
        use_nvml, use_pyzes: allow the in-process management libraries.
        use_torch: also ask ``torch.xpu`` in a throw-away ``torch_python`` process.
        timeout_s: limit for each vendor tool (nvidia-smi, xpu-smi, ...).
        report_missing: also record expected outcomes (a tool that is not installed).
        nvml_module, pyzes_module: stand-ins for ``pynvml``/``pyzes`` (tests).
        read_topology: also read how the GPUs are linked (NVLink, XGMI; the PCI paths and
            NUMA nodes are read with the PCI walk either way).
    """
    ctx = ProbeContext(
        sys_root=os.fspath(sys_root),
        proc_root=os.fspath(proc_root),
        runner=runner or SubprocessRunner(),
        env=dict(os.environ if env is None else env),
        timeout_s=timeout_s,
        report_missing=report_missing,
        perfmon=perfmon_capable(proc_root),
        use_nvml=use_nvml,
        nvml_module=nvml_module,
        use_pyzes=use_pyzes,
        pyzes_module=pyzes_module,
        use_torch=use_torch,
        torch_python=torch_python or sys.executable,
        read_topology=read_topology,
    )
    pci, problems = list_pci_gpus(sys_root)
    # NVIDIA always (NVML is cheap and says itself whether a driver is there); the others only
    # when sysfs shows their cards or cannot be read. One probe runs inline, more on threads.
    probes = [
        (vendor, probe)
        for vendor, probe in _PROBES
        if vendor is Vendor.NVIDIA or pci is None or any(g.vendor is vendor for g in pci)
    ]
    calls = [partial(probe, ctx, pci) for _, probe in probes]
    devices: list[Device] = []
    for (vendor, _), outcome in zip(probes, parallel(calls), strict=True):
        devices += to_devices(outcome.observations, _ORDER[vendor])
        problems += outcome.all_problems(report_missing)
    devices = with_driver_facts(devices, ctx.sys_root, ctx.proc_root)
    topology, topology_problems = read_cpu_topology(ctx.sys_root, ctx.proc_root)
    problems += topology_problems
    return Inventory(
        devices=tuple(devices),
        problems=tuple(dict.fromkeys(problems)),
        extra={} if topology is None else {TOPOLOGY_KEY: topology},
    )


def with_driver_facts(devices: list[Device], sys_root: str, proc_root: str) -> list[Device]:
    """Each device with its kernel driver's version and, for Intel, the Level Zero driver's.

    Packages are looked up under the directory that holds ``sys_root`` ("/" on a real host,
    the fake machine's root in tests)."""
    root = os.path.dirname(os.path.abspath(sys_root))
    intel = any(d.vendor is Vendor.INTEL for d in devices)
    l0 = level_zero_version(root) if intel else None
    legacy = legacy_level_zero_installed(root) if intel else None
    enriched = []
    versions: dict[str, str | None] = {}  # one read per driver, not per device
    for device in devices:
        facts: dict[str, object] = {}
        driver = device.extra.get("driver")
        if isinstance(driver, str) and "driver_version" not in device.extra:
            if driver not in versions:  # NVML already said it for NVIDIA GPUs
                versions[driver] = kernel_driver_version(sys_root, proc_root, driver)
            if versions[driver]:
                facts["driver_version"] = versions[driver]
        if device.vendor is Vendor.INTEL and l0:
            facts["level_zero_version"] = l0
        if device.vendor is Vendor.INTEL and legacy is not None:
            facts["level_zero_legacy1"] = legacy
        enriched.append(replace(device, extra={**device.extra, **facts}) if facts else device)
    return enriched


def probe_from_env(
    env: Mapping[str, str],
    *,
    use_torch: bool = False,
    report_missing: bool = False,
    read_topology: bool = True,
) -> Inventory:
    """``probe_host`` as the CLI runs it: honours the testing hooks ``XPULAUNCH_SYSFS_ROOT``
    and ``XPULAUNCH_PROCFS_ROOT`` (a fake machine: NVML and pyzes off)."""
    fake_sys = env.get(SYSFS_ROOT_ENV)
    fake_proc = env.get(PROCFS_ROOT_ENV)
    return probe_host(
        sys_root=fake_sys or "/sys",
        proc_root=fake_proc or "/proc",
        env=env,
        use_nvml=not fake_sys,
        use_pyzes=not fake_sys,
        use_torch=use_torch,
        report_missing=report_missing,
        read_topology=read_topology,
    )
