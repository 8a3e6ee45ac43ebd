"""Hardware probes: NVIDIA (NVML, nvidia-smi, procfs), Intel (sysfs, xpu-smi, pyzes, torch.xpu
in a subprocess) and AMD (sysfs, amd-smi, rocm-smi) -> one :class:`~xpulaunch.model.Inventory`.

Importing this package loads no vendor library: pynvml and pyzes are imported when a probe runs.
Its names are imported on first use (PEP 562): ``xpulaunch run`` imports
:mod:`xpulaunch.probe.isolated` in the supervisor and leaves the probes themselves to the
forked child.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpulaunch._lazy import exports

if TYPE_CHECKING:
    from xpulaunch.probe.host import probe_from_env, probe_host
    from xpulaunch.probe.runner import Runner, RunResult, SubprocessRunner

_MODULE_OF = {
    "probe_from_env": "xpulaunch.probe.host",
    "probe_host": "xpulaunch.probe.host",
    "RunResult": "xpulaunch.probe.runner",
    "Runner": "xpulaunch.probe.runner",
    "SubprocessRunner": "xpulaunch.probe.runner",
}

__all__ = ["RunResult", "Runner", "SubprocessRunner", "probe_from_env", "probe_host"]


__getattr__, __dir__ = exports(globals(), _MODULE_OF)
