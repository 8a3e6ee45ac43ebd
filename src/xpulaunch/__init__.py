"""xpulaunch: launch and supervise multi-GPU jobs and llama.cpp servers.

    import xpulaunch

    inventory = xpulaunch.probe()                     # no GPU runtime is initialised
    plan = xpulaunch.plan(["train.py"], gpus="2", nproc_per_node=None)
    status = xpulaunch.run(["train.py"], gpus="2", nproc_per_node=None)   # as the CLI does
    with xpulaunch.Supervisor(xpulaunch.worker_specs(plan)) as sup:       # or supervise it
        status = sup.wait()

Every public name is listed once, in ``_EXPORTS`` below, with the module it lives in; the
module is imported when the name is first used (PEP 562), so ``import xpulaunch`` for a plan
does not start the supervisor's machinery. The ``TYPE_CHECKING`` imports repeat the table for
type checkers, which cannot follow ``__getattr__``; a test holds the two equal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpulaunch._lazy import exports

__version__ = "0.1.0"

if TYPE_CHECKING:
    from xpulaunch.api import (
        inventory_document as inventory_document,
        load_inventory as load_inventory,
        plan as plan,
        plan_document as plan_document,
        probe as probe,
        run as run,
        worker_specs as worker_specs,
    )
    from xpulaunch.errors import (
        DeviceBusyError as DeviceBusyError,
        InventoryError as InventoryError,
        LaunchError as LaunchError,
        LeaseError as LeaseError,
        MaskError as MaskError,
        ProbeError as ProbeError,
        QueueError as QueueError,
        SelectionError as SelectionError,
        ServerStartError as ServerStartError,
        UsageError as UsageError,
        WaitTimeoutError as WaitTimeoutError,
        WorkerFailedError as WorkerFailedError,
        XpulaunchError as XpulaunchError,
    )
    from xpulaunch.events import (
        Event as Event,
        Exited as Exited,
        GaveUp as GaveUp,
        HangDetected as HangDetected,
        Ready as Ready,
        Restarting as Restarting,
        Started as Started,
        Stopped as Stopped,
        Stopping as Stopping,
        TimedOut as TimedOut,
        Unhealthy as Unhealthy,
        WorkerState as WorkerState,
        WorkerStatus as WorkerStatus,
    )
    from xpulaunch.in_worker import heartbeat as heartbeat
    from xpulaunch.joblog.logs import LogConfig as LogConfig
    from xpulaunch.launch.request import RunRequest as RunRequest
    from xpulaunch.leases.manager import Lease as Lease, LeaseManager as LeaseManager
    from xpulaunch.llamacpp.router.serve import serve_models as serve_models
    from xpulaunch.llamacpp.serve import plan_llama as plan_llama, serve_llama as serve_llama
    from xpulaunch.llamacpp.server import LlamaServer as LlamaServer
    from xpulaunch.model import (
        Backend as Backend,
        Device as Device,
        DeviceMap as DeviceMap,
        DeviceShare as DeviceShare,
        Hierarchy as Hierarchy,
        Inventory as Inventory,
        MigDevice as MigDevice,
        NodeGroup as NodeGroup,
        Plan as Plan,
        Problem as Problem,
        Unit as Unit,
        Vendor as Vendor,
        WorkerPlan as WorkerPlan,
    )
    from xpulaunch.supervisor.restart import (
        RestartMode as RestartMode,
        RestartPolicy as RestartPolicy,
    )
    from xpulaunch.supervisor.spec import (
        HealthCheck as HealthCheck,
        SupervisorSettings as SupervisorSettings,
        WorkerSpec as WorkerSpec,
    )
    from xpulaunch.supervisor.supervisor import Supervisor as Supervisor

# Each public name, under the module that defines it.
_EXPORTS = {
    "xpulaunch.api": (
        "inventory_document",
        "load_inventory",
        "plan",
        "plan_document",
        "probe",
        "run",
        "worker_specs",
    ),
    "xpulaunch.supervisor.restart": (
        "RestartMode",
        "RestartPolicy",
    ),
    "xpulaunch.errors": (
        "DeviceBusyError",
        "InventoryError",
        "LaunchError",
        "LeaseError",
        "MaskError",
        "ProbeError",
        "QueueError",
        "SelectionError",
        "ServerStartError",
        "UsageError",
        "WaitTimeoutError",
        "WorkerFailedError",
        "XpulaunchError",
    ),
    "xpulaunch.events": (
        "Event",
        "Exited",
        "GaveUp",
        "HangDetected",
        "Ready",
        "Restarting",
        "Started",
        "Stopped",
        "Stopping",
        "TimedOut",
        "Unhealthy",
        "WorkerState",
        "WorkerStatus",
    ),
    "xpulaunch.in_worker": ("heartbeat",),
    "xpulaunch.joblog.logs": ("LogConfig",),
    "xpulaunch.launch.request": ("RunRequest",),
    "xpulaunch.leases.manager": (
        "Lease",
        "LeaseManager",
    ),
    "xpulaunch.llamacpp.serve": (
        "plan_llama",
        "serve_llama",
    ),
    "xpulaunch.llamacpp.server": ("LlamaServer",),
    "xpulaunch.llamacpp.router.serve": ("serve_models",),
    "xpulaunch.model": (
        "Backend",
        "Device",
        "DeviceMap",
        "DeviceShare",
        "Hierarchy",
        "Inventory",
        "MigDevice",
        "NodeGroup",
        "Plan",
        "Problem",
        "Unit",
        "Vendor",
        "WorkerPlan",
    ),
    "xpulaunch.supervisor.spec": (
        "HealthCheck",
        "SupervisorSettings",
        "WorkerSpec",
    ),
    "xpulaunch.supervisor.supervisor": ("Supervisor",),
}
__all__ = [name for names in _EXPORTS.values() for name in names]

__getattr__, __dir__ = exports(globals(), _EXPORTS)
