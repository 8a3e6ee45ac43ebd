"""Device leases: which job holds which device, across processes and users.

``manager`` (:class:`Lease`, :class:`LeaseManager`: allocation and ``status``),
``lock_directory`` (where the lock files live, who may use them, flock), ``lock_files`` (unit
key <-> lock file name, and :class:`HolderInfo`, who holds or waits), ``slots`` (devices shared
by small jobs) and ``wait_queue`` (the first-come-first-served line of launches waiting with
``--wait``; :class:`~xpulaunch.leases.wait_queue.WaitStatus`, where a waiter stands).

The names below are imported from their modules on first use (PEP 562), so importing one
module of the package (``slots``) does not load the others; the package's own modules import
each other by their full names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpulaunch._lazy import exports

if TYPE_CHECKING:
    from xpulaunch.leases.lock_files import HolderInfo as HolderInfo
    from xpulaunch.leases.manager import (
        Lease as Lease,
        LeaseManager as LeaseManager,
        LeaseRecord as LeaseRecord,
        PlanFn as PlanFn,
        StatusReport as StatusReport,
    )

_EXPORTS = {
    "xpulaunch.leases.lock_files": ("HolderInfo",),
    "xpulaunch.leases.manager": ("Lease", "LeaseManager", "LeaseRecord", "PlanFn", "StatusReport"),
}
__all__ = [name for names in _EXPORTS.values() for name in names]
__getattr__, __dir__ = exports(globals(), _EXPORTS)
