"""Hardware probes: NVIDIA (NVML, nvidia-smi, procfs), Intel (sysfs, xpu-smi, pyzes, torch.xpu
in a subprocess) and AMD (sysfs, amd-smi, rocm-smi) -> one :class:`~xpulaunch.model.Inventory`.

Importing this package loads no vendor library: pynvml and pyzes are imported when a probe runs.
"""

from __future__ import annotations

from xpulaunch.probe.host import probe_from_env, probe_host
from xpulaunch.probe.runner import Runner, RunResult, SubprocessRunner

__all__ = ["RunResult", "Runner", "SubprocessRunner", "probe_from_env", "probe_host"]
