"""xpulaunch: launch and supervise multi-GPU jobs and llama.cpp servers.

    import xpulaunch

    inventory = xpulaunch.probe()                     # no GPU runtime is initialised
    plan = xpulaunch.plan(["train.py"], gpus="2", nproc_per_node=None)
    with xpulaunch.Supervisor(xpulaunch.worker_specs(plan)) as sup:
        sup.start()
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
    )
    from xpulaunch.api import (
        load_inventory as load_inventory,
    )
    from xpulaunch.api import (
        plan as plan,
    )
    from xpulaunch.api import (
        plan_document as plan_document,
    )
    from xpulaunch.api import (
        probe as probe,
    )
    from xpulaunch.api import (
        worker_specs as worker_specs,
    )
    from xpulaunch.core.plan import LaunchRequest as LaunchRequest
    from xpulaunch.core.plan import make_plan as make_plan
    from xpulaunch.core.restart import RestartMode as RestartMode
    from xpulaunch.core.restart import RestartPolicy as RestartPolicy
    from xpulaunch.errors import (
        DeviceBusyError as DeviceBusyError,
    )
    from xpulaunch.errors import (
        InventoryError as InventoryError,
    )
    from xpulaunch.errors import (
        LaunchError as LaunchError,
    )
    from xpulaunch.errors import (
        LeaseError as LeaseError,
    )
    from xpulaunch.errors import (
        MaskError as MaskError,
    )
    from xpulaunch.errors import (
        ProbeError as ProbeError,
    )
    from xpulaunch.errors import (
        SelectionError as SelectionError,
    )
    from xpulaunch.errors import (
        ServerStartError as ServerStartError,
    )
    from xpulaunch.errors import (
        UsageError as UsageError,
    )
    from xpulaunch.errors import (
        WaitTimeoutError as WaitTimeoutError,
    )
    from xpulaunch.errors import (
        WorkerFailedError as WorkerFailedError,
    )
    from xpulaunch.errors import (
        XpulaunchError as XpulaunchError,
    )
    from xpulaunch.events import (
        Event as Event,
    )
    from xpulaunch.events import (
        Exited as Exited,
    )
    from xpulaunch.events import (
        GaveUp as GaveUp,
    )
    from xpulaunch.events import (
        HangDetected as HangDetected,
    )
    from xpulaunch.events import (
        Ready as Ready,
    )
    from xpulaunch.events import (
        Restarting as Restarting,
    )
    from xpulaunch.events import (
        Started as Started,
    )
    from xpulaunch.events import (
        Stopped as Stopped,
    )
    from xpulaunch.events import (
        Stopping as Stopping,
    )
    from xpulaunch.events import (
        TimedOut as TimedOut,
    )
    from xpulaunch.events import (
        Unhealthy as Unhealthy,
    )
    from xpulaunch.events import (
        WorkerState as WorkerState,
    )
    from xpulaunch.events import (
        WorkerStatus as WorkerStatus,
    )
    from xpulaunch.in_worker import heartbeat as heartbeat
    from xpulaunch.joblog.logs import LogConfig as LogConfig
    from xpulaunch.launch.run import RunOptions as RunOptions
    from xpulaunch.launch.run import run_plan as run_plan
    from xpulaunch.leases import Lease as Lease
    from xpulaunch.leases import LeaseManager as LeaseManager
    from xpulaunch.llamacpp import LlamaServer as LlamaServer
    from xpulaunch.llamacpp import plan_llama as plan_llama
    from xpulaunch.llamacpp import serve_llama as serve_llama
    from xpulaunch.llamacpp.router.serve import serve_models as serve_models
    from xpulaunch.model import (
        Backend as Backend,
    )
    from xpulaunch.model import (
        Device as Device,
    )
    from xpulaunch.model import (
        DeviceMap as DeviceMap,
    )
    from xpulaunch.model import (
        Hierarchy as Hierarchy,
    )
    from xpulaunch.model import (
        Inventory as Inventory,
    )
    from xpulaunch.model import (
        MigDevice as MigDevice,
    )
    from xpulaunch.model import (
        NodeGroup as NodeGroup,
    )
    from xpulaunch.model import (
        Plan as Plan,
    )
    from xpulaunch.model import (
        Problem as Problem,
    )
    from xpulaunch.model import (
        Unit as Unit,
    )
    from xpulaunch.model import (
        Vendor as Vendor,
    )
    from xpulaunch.model import (
        WorkerPlan as WorkerPlan,
    )
    from xpulaunch.supervisor.spec import Probe as Probe
    from xpulaunch.supervisor.spec import WorkerSpec as WorkerSpec
    from xpulaunch.supervisor.supervisor import Supervisor as Supervisor

# Each public name, under the module that defines it.
_EXPORTS = {
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
    "xpulaunch.in_worker": ("heartbeat",),
    "xpulaunch.llamacpp": ("LlamaServer", "plan_llama", "serve_llama"),
    "xpulaunch.llamacpp.router.serve": ("serve_models",),
    "xpulaunch.model": (
        "Backend", "Device", "DeviceMap", "Hierarchy", "Inventory", "MigDevice", "NodeGroup",
        "Plan", "Problem", "Unit", "Vendor", "WorkerPlan",
    ),
    "xpulaunch.events": (
        "Event", "Exited", "GaveUp", "HangDetected", "Ready", "Restarting", "Started",
        "Stopped", "Stopping", "TimedOut", "Unhealthy", "WorkerState", "WorkerStatus",
    ),
    "xpulaunch.launch.run": ("RunOptions", "run_plan"),
    "xpulaunch.leases": ("Lease", "LeaseManager"),
    "xpulaunch.joblog.logs": ("LogConfig",),
    "xpulaunch.supervisor.spec": ("Probe", "WorkerSpec"),
    "xpulaunch.supervisor.supervisor": ("Supervisor",),
}  # fmt: skip
__all__ = [name for names in _EXPORTS.values() for name in names]

__getattr__, __dir__ = exports(globals(), _EXPORTS)
