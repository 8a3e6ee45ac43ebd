"""``xpulaunch devices --processes``: who uses each device, and whether a lease covers it.

The processes go into the inventory document as a top-level ``processes`` list (extra keys
are allowed by the contract), so ``--json`` and the table show the same facts.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from xpulaunch.cli.terminal import aligned
from xpulaunch.model import Inventory, Problem

if TYPE_CHECKING:
    from collections.abc import Sequence

    from xpulaunch.model import Device
    from xpulaunch.probing.gpu_processes import GpuProcess

_GIB = 1024**3


def with_processes(inventory: Inventory, *, probed: bool) -> Inventory:
    """The inventory plus its ``processes`` (only for the host it describes)."""
    if not probed:
        note = Problem("processes", "not listed: the inventory comes from a file, not this host")
        return replace(inventory, problems=(*inventory.problems, note))
    from xpulaunch.probing.gpu_processes import gpu_processes
    from xpulaunch.probing.host import PROCFS_ROOT_ENV

    proc_root = os.environ.get(PROCFS_ROOT_ENV) or "/proc"
    found, problems = gpu_processes(inventory.devices, proc_root=proc_root)
    leases = _lease_jobs()
    rows = [_row(p, inventory.devices, leases) for p in found]
    extra = {**inventory.extra, "processes": rows}
    return replace(inventory, problems=(*inventory.problems, *problems), extra=extra)


def _lease_jobs() -> list[tuple[str, str]]:
    """(leased unit key, the job id holding it): whole-device leases and the slots of
    shared devices (--slots-per-gpu: one device, several jobs), of the default lock
    directory."""
    from xpulaunch.leases.manager import LeaseManager

    report = LeaseManager(os.environ.get("XPULAUNCH_LOCK_DIR")).status()
    return [(key, holder.job_id) for key, holder in report.holders()]


def _row(
    process: GpuProcess, devices: Sequence[Device], leases: Sequence[tuple[str, str]]
) -> dict[str, object]:
    device = next((d for d in devices if d.key == process.device_key), None)
    held = {job for key, job in leases if key.split("/")[0] == process.device_key}
    # covered: a lease on this device is held by the job the process belongs to; None when
    # the device is leased but the process's environment (its job) could not be read. A
    # readable environment without XPULAUNCH_JOB_ID is no job's: not covered.
    unknown = held and process.job_id is None and not process.environ_read
    covered = None if unknown else process.job_id in held
    return {
        "device": f"{device.vendor.value}:{device.index}" if device else process.device_key,
        "pci_bus_id": device.pci_bus_id if device else None,
        "pid": process.pid,
        "user": process.user,
        "command": process.command,
        "memory_bytes": process.memory_bytes,
        "source": process.source,
        "xpulaunch_job": process.job_id,
        "lease_covers": covered,
    }


def render_processes(inventory: Inventory) -> str:
    rows = inventory.extra.get("processes")
    if not isinstance(rows, list):
        return ""
    if not rows:
        return "\nNo processes are using these devices (that this user can see)."
    header = ("DEVICE", "PID", "USER", "MEMORY", "LEASE", "COMMAND")
    table = aligned([header, *(_cells(r) for r in rows if isinstance(r, dict))])
    lines = ["", "PROCESSES", *(line.rstrip() for line in table)]
    return "\n".join([*lines, *_uncovered(rows)])


# Why a device can be in use and free to lease: leases are advisory, and a job's processes are
# found by its cgroup and by the lease's descriptor they inherit; one that leaves both is no
# longer the job's, and its device is freed when the job ends.
UNCOVERED_NOTE = (
    "  xpulaunch may give these devices to a new job: a process started without xpulaunch",
    "  holds no lease, and one that left its job's cgroup and closed the lease's descriptor",
    "  (root, or a delegated cgroup, can) is no longer the job's. Only a device cgroup would",
    "  keep such a process off the device.",
)


def _uncovered(rows: list[object]) -> list[str]:
    """The footer naming every process that no lease covers (LEASE ``no``)."""
    found = [r for r in rows if isinstance(r, dict) and r.get("lease_covers") is False]
    if not found:
        return []
    named = ", ".join(f"{r.get('device')} pid {r.get('pid')}" for r in found)
    return ["", f"not covered by a lease: {named}", *UNCOVERED_NOTE]


def _cells(row: dict[str, object]) -> tuple[str, str, str, str, str, str]:
    memory = row.get("memory_bytes")
    shown = "?" if not isinstance(memory, int) else f"{memory / _GIB:.2f} GiB"
    covered = row.get("lease_covers")
    lease = "?" if not isinstance(covered, bool) else "yes" if covered else "no"
    return (
        str(row.get("device")),
        str(row.get("pid")),
        str(row.get("user") or "?"),
        shown,
        lease,
        str(row.get("command") or "?")[:80],
    )
