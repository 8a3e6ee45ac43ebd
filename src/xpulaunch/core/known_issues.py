"""Known-bad combinations of hardware, kernel driver and user-space driver, with sources.

Pure: a device's recorded facts (``extra``: ``driver``, ``pci_device_id``,
``level_zero_version``) in, warnings out. Each entry cites the public report that measured
the problem and names the version that fixes it, so a warning says what to upgrade to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpulaunch.model import Vendor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from xpulaunch.model import Device


@dataclass(frozen=True, slots=True)
class KnownIssue:
    vendor: Vendor
    kernel_driver: str
    pci_id_prefix: int  # high byte of the PCI device id: the product family
    component: str  # which recorded version the range is about
    bad_from: tuple[int, ...]
    fixed_in: tuple[int, ...]
    problem: str
    source: str

    def fix(self) -> str:
        return f"upgrade {self.component} to {_dotted(self.fixed_in)} or later"


KNOWN_ISSUES: Sequence[KnownIssue] = (
    KnownIssue(
        vendor=Vendor.INTEL,
        kernel_driver="xe",
        pci_id_prefix=0xE2,  # Arc B-series (Battlemage)
        component="level_zero_version",
        bad_from=(25, 18),
        fixed_in=(26, 9),
        problem="every device allocation is mirrored in host memory (about 1 GB of RAM per "
        "GB of VRAM)",
        source="pytorch/pytorch#180145 (traced to compute-runtime 25.18, gone with 26.09)",
    ),
)

_NAMES = {"level_zero_version": "compute-runtime (Level Zero GPU driver)"}


def issues_of(device: Device, table: Sequence[KnownIssue] = KNOWN_ISSUES) -> list[str]:
    """A warning per known-bad combination ``device`` is in."""
    return [_warning(device, issue) for issue in table if _applies(device, issue)]


def _applies(device: Device, issue: KnownIssue) -> bool:
    device_id = _hex(device.extra.get("pci_device_id"))
    version = version_tuple(device.extra.get(issue.component))
    return (
        device.vendor is issue.vendor
        and device.extra.get("driver") == issue.kernel_driver
        and device_id is not None
        and device_id >> 8 == issue.pci_id_prefix
        and version is not None
        and issue.bad_from <= version < issue.fixed_in
    )


def _warning(device: Device, issue: KnownIssue) -> str:
    version = device.extra.get(issue.component)
    name = _NAMES.get(issue.component, issue.component)
    return (
        f"{device.label()}: known problem with {name} {version} on {issue.kernel_driver}: "
        f"{issue.problem}; {issue.fix().replace(issue.component, name)} ({issue.source})"
    )


def version_tuple(text: object) -> tuple[int, ...] | None:
    """``25.18.33578.6`` (or ``1:25.18.33578.6-1ubuntu1``) -> (25, 18, 33578, 6)."""
    if not isinstance(text, str):
        return None
    match = re.search(r"(\d+(?:\.\d+)+)", text.split(":", 1)[-1])
    return tuple(int(p) for p in match[1].split(".")) if match else None


def _hex(text: object) -> int | None:
    try:
        return int(text, 16) if isinstance(text, str) else None
    except ValueError:
        return None


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(f"{p:02d}" if i else str(p) for i, p in enumerate(version))
