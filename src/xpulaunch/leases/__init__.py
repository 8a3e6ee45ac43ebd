"""Device leases: which job holds which device, across processes and users.

``manager`` (:class:`Lease`, :class:`LeaseManager`: allocation and ``status``),
``lock_directory`` (where the lock files live, who may use them, flock),
``file_names`` (unit key <-> lock file name) and ``wait_queue`` (the first-come-first-served
line of launches waiting with ``--wait``, and :class:`HolderInfo`, who holds or waits).
"""

from xpulaunch.leases.manager import Lease, LeaseManager, LeaseRecord, PlanFn, StatusReport
from xpulaunch.leases.wait_queue import HolderInfo, WaiterRecord, WaitStatus

__all__ = [
    "HolderInfo",
    "Lease",
    "LeaseManager",
    "LeaseRecord",
    "PlanFn",
    "StatusReport",
    "WaitStatus",
    "WaiterRecord",
]
