"""Hardware probes: NVIDIA (NVML, nvidia-smi, procfs), Intel (sysfs, xpu-smi, pyzes, torch.xpu
in a subprocess) and AMD (sysfs, amd-smi, rocm-smi) -> one :class:`~xpulaunch.model.Inventory`.

Importing this package loads no vendor library: pynvml and pyzes are imported when a probe
runs. ``xpulaunch run`` probes in a forked child (:mod:`xpulaunch.probing.isolated`), so the
supervisor never holds a vendor library.
"""

from __future__ import annotations

from xpulaunch.probing.host import probe_from_env, probe_host
from xpulaunch.probing.runner import Runner, RunResult, SubprocessRunner

__all__ = ["RunResult", "Runner", "SubprocessRunner", "probe_from_env", "probe_host"]
