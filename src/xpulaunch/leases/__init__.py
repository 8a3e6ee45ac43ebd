"""Device leases: which job holds which device, across processes and users.

``manager`` (:class:`Lease`, :class:`LeaseManager`: allocation and ``status``),
``lock_directory`` (where the lock files live, who may use them, flock), ``lock_files`` (unit
key <-> lock file name, and :class:`HolderInfo`, who holds or waits), ``slots`` (devices shared
by small jobs) and ``wait_queue`` (the first-come-first-served line of launches waiting with
``--wait``; :class:`~xpulaunch.leases.wait_queue.WaitStatus`, where a waiter stands).
"""

from xpulaunch.leases.lock_files import HolderInfo
from xpulaunch.leases.manager import Lease, LeaseManager, LeaseRecord, PlanFn, StatusReport

__all__ = [
    "HolderInfo",
    "Lease",
    "LeaseManager",
    "LeaseRecord",
    "PlanFn",
    "StatusReport",
]
