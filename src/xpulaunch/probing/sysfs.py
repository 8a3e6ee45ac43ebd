"""The PCI walk: every GPU of the host from ``/sys/bus/pci/devices``, no runtime, no root.

``/sys/class/drm`` is not enough: it is absent where no DRM driver is loaded (our NVIDIA VMs have
no nvidia-drm) and its ``cardN`` numbering interleaves vendors and is not stable (reference
section 1, 2.6). So the walk is over PCI addresses, and DRM nodes are only looked up per device.
Roots are parameters so tests build fake trees in ``tmp_path``; they are strings, walked with
``os.path``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from xpulaunch.core.device_ids import normalize_bus_id
from xpulaunch.model import Problem, Vendor
from xpulaunch.probing.parsers.common import ParseError
from xpulaunch.probing.parsers.numa import parse_cpus, parse_numa_node
from xpulaunch.probing.parsers.topology import pci_path

VENDOR_IDS = {0x10DE: Vendor.NVIDIA, 0x8086: Vendor.INTEL, 0x1002: Vendor.AMD}
GPU_DRIVERS = {Vendor.NVIDIA: ("nvidia",), Vendor.INTEL: ("i915", "xe"), Vendor.AMD: ("amdgpu",)}
_DISPLAY_CLASS = 0x03
# Some compute-only boards report "processing accelerator" (0x1200) instead of a display class
# (not verified on AMD Instinct hardware). 0x1200 is also the class of Intel's NPU (driver
# intel_vpu), so it only counts when a GPU driver is bound.
_ACCELERATOR_CLASS = 0x1200
_DRM_CARD = re.compile(r"^card[0-9]+$")
_CAP_SYS_ADMIN, _CAP_PERFMON = 21, 38


@dataclass(frozen=True, slots=True)
class PciGpu:
    """One GPU function as sysfs shows it."""

    bus_id: str
    vendor: Vendor
    device_id: int | None
    class_code: int
    driver: str | None
    drm_cards: tuple[str, ...]
    path: str  # its sysfs directory
    # sysfs ``numa_node`` (None for -1: not known) and ``local_cpulist``; absent: not read
    numa: tuple[tuple[str, object], ...] = ()
    # the host bridge and the PCI bridges above it (core.topology); None: not known
    bridges: tuple[str, ...] | None = None

    @property
    def has_gpu_driver(self) -> bool:
        return self.driver in GPU_DRIVERS[self.vendor]

    def describe(self) -> str:
        dev = f"0x{self.device_id:04x}" if self.device_id is not None else "?"
        return f"{self.vendor.value} device {dev}"

    def facts(self) -> dict[str, object]:
        """What sysfs adds to a device's document: driver and PCI device id."""
        facts: dict[str, object] = {"driver": self.driver}
        if self.device_id is not None:
            facts["pci_device_id"] = f"0x{self.device_id:04x}"
        facts.update(self.numa)
        if self.bridges is not None:
            facts["pci_path"] = list(self.bridges)
        return facts

    def skipped(self) -> Problem:
        """Why a GPU without its vendor's driver (vfio-pci, none) is not in the inventory."""
        expected = " or ".join(GPU_DRIVERS[self.vendor])
        bound = self.driver or "no driver"
        return Problem(
            "sysfs", f"{self.describe()} is bound to {bound}, not {expected}; skipped", self.bus_id
        )


def list_pci_gpus(
    sys_root: str | os.PathLike[str] = "/sys",
) -> tuple[list[PciGpu] | None, list[Problem]]:
    """Every NVIDIA, Intel and AMD GPU function, sorted by PCI address.

    Returns ``None`` (and a problem) when the PCI directory cannot be listed at all, so callers
    can tell "no GPU here" from "cannot see".
    """
    pci_dir = os.path.join(sys_root, "bus", "pci", "devices")
    try:
        entries = sorted(os.listdir(pci_dir))
    except OSError as exc:
        return None, [Problem("sysfs", f"cannot list {pci_dir}: {exc.strerror or exc}")]
    problems: list[Problem] = []
    found = [_read_pci_gpu(os.path.join(pci_dir, entry), problems) for entry in entries]
    return sorted((g for g in found if g is not None), key=lambda g: g.bus_id), problems


def _read_pci_gpu(path: str, problems: list[Problem]) -> PciGpu | None:
    bus_id = normalize_bus_id(os.path.basename(path))
    vendor_id = read_int(os.path.join(path, "vendor"), problems)
    if bus_id is None or vendor_id not in VENDOR_IDS:
        return None
    class_code = read_int(os.path.join(path, "class"), problems)
    if class_code is None:
        return None
    vendor = VENDOR_IDS[vendor_id]
    driver = _driver_name(path)
    is_display = class_code >> 16 == _DISPLAY_CLASS
    is_accelerator = class_code >> 8 == _ACCELERATOR_CLASS and driver in GPU_DRIVERS[vendor]
    if not (is_display or is_accelerator):
        return None
    return PciGpu(
        bus_id=bus_id,
        vendor=vendor,
        device_id=read_int(os.path.join(path, "device"), problems),
        class_code=class_code,
        driver=driver,
        drm_cards=_drm_cards(path),
        path=path,
        numa=_numa_facts(path, problems),
        bridges=_bridges(path),
    )


def _bridges(path: str) -> tuple[str, ...] | None:
    """The bridges above the device: its ``/sys/bus/pci/devices`` entry is a link to its place
    in the device tree (``../../../devices/pci0000:15/0000:15:01.0/.../0000:18:00.0``)."""
    found = pci_path(os.path.realpath(path))
    return None if found is None else tuple(found)


def _numa_facts(path: str, problems: list[Problem]) -> tuple[tuple[str, object], ...]:
    """The device's NUMA node and the CPUs the kernel lists as local to it (--cpu-bind)."""
    facts: list[tuple[str, object]] = []
    for name, parse in (("numa_node", parse_numa_node), ("local_cpulist", parse_cpus)):
        text = read_text(os.path.join(path, name), problems)
        if text is None:
            continue
        try:
            facts.append((name, parse(text)))
        except ParseError as exc:
            problems.append(Problem("sysfs", f"{path}/{name}: {exc}"))
    return tuple(facts)


def _driver_name(path: str) -> str | None:
    try:
        # The link's last component (``../../../bus/pci/drivers/nvidia`` -> ``nvidia``).
        return os.path.basename(os.path.normpath(os.readlink(os.path.join(path, "driver"))))
    except OSError:
        # No driver bound: the link does not exist (ENOENT). Any other error means the same
        # thing for us - the device cannot be used through a vendor stack.
        return None


def _drm_cards(path: str) -> tuple[str, ...]:
    """``cardN`` minors of this device; connectors (``card0-HDMI-A-1``) and render nodes skipped."""
    try:
        names = os.listdir(os.path.join(path, "drm"))
    except OSError:
        return ()
    return tuple(sorted((n for n in names if _DRM_CARD.match(n)), key=lambda n: int(n[4:])))


def read_text(path: str, problems: list[Problem], source: str = "sysfs") -> str | None:
    """A sysfs attribute's text; ``None`` when absent (the normal case for optional files)."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        problems.append(Problem(source, f"cannot read {path}: {exc.strerror or exc}"))
        return None


def read_int(path: str, problems: list[Problem], source: str = "sysfs") -> int | None:
    """A decimal or ``0x`` hex attribute (``"0x8086"``, ``"34342961152"``); ``None`` if absent."""
    text = read_text(path, problems, source)
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        problems.append(Problem(source, f"{path} holds {text!r}, not a number"))
        return None


def count_tiles(gpu: PciGpu) -> int | None:
    """xe creates one ``tile<N>`` directory per tile on the PCI device (xe_tile_sysfs.c)."""
    try:
        tiles = [n for n in os.listdir(gpu.path) if n.startswith("tile") and n[4:].isdigit()]
    except OSError:
        return None
    return len(tiles) or None


def perfmon_capable(proc_root: str | os.PathLike[str] = "/proc") -> bool:
    """Whether this process has CAP_PERFMON or CAP_SYS_ADMIN (root has both).

    i915 and xe fill "used/unallocated" VRAM figures only for ``perfmon_capable()`` callers and
    otherwise report free == total (i915_query.c, xe_query.c). Unreadable
    status counts as not capable: a reading we cannot trust is unknown.
    """
    try:
        with open(
            os.path.join(proc_root, "self", "status"), encoding="ascii", errors="replace"
        ) as f:
            status = f.read()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            try:
                caps = int(line.split(":", 1)[1].strip(), 16)
            except ValueError:
                return False
            return bool(caps >> _CAP_PERFMON & 1 or caps >> _CAP_SYS_ADMIN & 1)
    return False


# hwmon attributes (the kernel's Documentation/hwmon/sysfs-interface.rst): temperatures in
# millidegrees Celsius, power in microwatts. amdgpu names its power power1_average (older
# kernels) or power1_input; i915 and xe report energy, not power, and their temperature only on
# newer kernels: what is absent is left out (unknown, never 0).
_HWMON = (
    ("temperature_celsius", ("temp1_input", "temp2_input"), 1e-3),
    ("power_watts", ("power1_average", "power1_input"), 1e-6),
)


def hwmon_readings(device_path: str) -> dict[str, float]:
    """``temperature_celsius`` and ``power_watts`` of a PCI device from its hwmon folder,
    each where the driver reports it; files are re-read at each call (the readings change)."""
    readings: dict[str, float] = {}
    try:
        folders = sorted(os.listdir(os.path.join(device_path, "hwmon")))
    except OSError:  # no hwmon: a driver without it, or an older kernel
        return readings
    for folder in folders:
        base = os.path.join(device_path, "hwmon", folder)
        for key, names, scale in _HWMON:
            for name in names:
                value = _hwmon_value(os.path.join(base, name))
                if key not in readings and value is not None:
                    readings[key] = round(value * scale, 1)
    return readings


def _hwmon_value(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):  # absent, or "-ENODATA" style answers of a sleeping card
        return None
