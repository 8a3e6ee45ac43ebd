"""xpulaunch: launch and supervise multi-GPU jobs and llama.cpp servers.

    import xpulaunch

    inventory = xpulaunch.probe()                     # no GPU runtime is initialised
    plan = xpulaunch.plan(["train.py"], gpus="2", nproc_per_node=None)
    with xpulaunch.Supervisor(xpulaunch.worker_specs(plan)) as sup:
        sup.start()
        status = sup.wait()

Names are imported on first use (PEP 562), so ``import xpulaunch`` stays cheap and a dry run
never loads the supervisor.
"""

from __future__ import annotations

from xpulaunch._lazy import exports

__version__ = "0.1.0"

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xpulaunch.api import (
        inventory_document,
        load_inventory,
        plan,
        plan_document,
        probe,
        worker_specs,
    )
    from xpulaunch.core.plan import LaunchRequest, make_plan
    from xpulaunch.core.restart import RestartMode, RestartPolicy
    from xpulaunch.errors import (
        DeviceBusyError,
        InventoryError,
        LaunchError,
        LeaseError,
        MaskError,
        ProbeError,
        SelectionError,
        ServerStartError,
        UsageError,
        WaitTimeoutError,
        WorkerFailedError,
        XpulaunchError,
    )
    from xpulaunch.llamacpp import LlamaServer, plan_llama, serve_llama
    from xpulaunch.model import (
        Backend,
        Device,
        DeviceMap,
        Hierarchy,
        Inventory,
        MigDevice,
        Plan,
        Problem,
        Unit,
        Vendor,
        WorkerPlan,
    )
    from xpulaunch.proc.events import (
        Event,
        Exited,
        GaveUp,
        Ready,
        Restarting,
        Started,
        Stopped,
        Stopping,
        Unhealthy,
        WorkerState,
        WorkerStatus,
    )
    from xpulaunch.proc.launch import RunOptions, run_plan
    from xpulaunch.proc.leases import Lease, LeaseManager
    from xpulaunch.proc.logs import LogConfig
    from xpulaunch.proc.spec import Probe, WorkerSpec
    from xpulaunch.proc.supervisor import Supervisor

_WHERE = {
    "xpulaunch.api": (
        "inventory_document", "load_inventory", "plan", "plan_document", "probe",
        "worker_specs",
    ),
    "xpulaunch.core.plan": ("LaunchRequest", "make_plan"),
    "xpulaunch.core.restart": ("RestartMode", "RestartPolicy"),
    "xpulaunch.errors": (
        "DeviceBusyError", "InventoryError", "LaunchError", "LeaseError", "MaskError",
        "ProbeError", "SelectionError", "ServerStartError", "UsageError", "WaitTimeoutError",
        "WorkerFailedError", "XpulaunchError",
    ),
    "xpulaunch.llamacpp": ("LlamaServer", "plan_llama", "serve_llama"),
    "xpulaunch.model": (
        "Backend", "Device", "DeviceMap", "Hierarchy", "Inventory", "MigDevice", "Plan",
        "Problem", "Unit", "Vendor", "WorkerPlan",
    ),
    "xpulaunch.proc.events": (
        "Event", "Exited", "GaveUp", "Ready", "Restarting", "Started", "Stopped", "Stopping",
        "Unhealthy", "WorkerState", "WorkerStatus",
    ),
    "xpulaunch.proc.launch": ("RunOptions", "run_plan"),
    "xpulaunch.proc.leases": ("Lease", "LeaseManager"),
    "xpulaunch.proc.logs": ("LogConfig",),
    "xpulaunch.proc.spec": ("Probe", "WorkerSpec"),
    "xpulaunch.proc.supervisor": ("Supervisor",),
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}

__all__ = [
    "Backend",
    "Device",
    "DeviceBusyError",
    "DeviceMap",
    "Event",
    "Exited",
    "GaveUp",
    "Hierarchy",
    "Inventory",
    "InventoryError",
    "LaunchError",
    "LaunchRequest",
    "Lease",
    "LeaseError",
    "LeaseManager",
    "LlamaServer",
    "LogConfig",
    "MaskError",
    "MigDevice",
    "Plan",
    "Probe",
    "ProbeError",
    "Problem",
    "Ready",
    "RestartMode",
    "RestartPolicy",
    "Restarting",
    "RunOptions",
    "SelectionError",
    "ServerStartError",
    "Started",
    "Stopped",
    "Stopping",
    "Supervisor",
    "Unhealthy",
    "Unit",
    "UsageError",
    "Vendor",
    "WaitTimeoutError",
    "WorkerFailedError",
    "WorkerPlan",
    "WorkerSpec",
    "WorkerState",
    "WorkerStatus",
    "XpulaunchError",
    "inventory_document",
    "load_inventory",
    "make_plan",
    "plan",
    "plan_document",
    "plan_llama",
    "probe",
    "run_plan",
    "serve_llama",
    "worker_specs",
]


__getattr__, __dir__ = exports(globals(), _MODULE_OF)
