"""Hardware probes: NVIDIA (NVML, nvidia-smi, procfs), Intel (sysfs, xpu-smi, pyzes, torch.xpu
in a subprocess) and AMD (sysfs, amd-smi, rocm-smi) -> one :class:`~xpulaunch.model.Inventory`.

Importing this package loads no vendor library: pynvml and pyzes are imported when a probe
runs. ``xpulaunch run`` probes in a forked child (:mod:`xpulaunch.probing.isolated`), so the
supervisor never holds a vendor library.

The probes are :func:`xpulaunch.probing.host.probe_from_env` and
:func:`~xpulaunch.probing.host.probe_host`. This package's ``__init__`` imports none of its
modules, so that importing one probe does not load every vendor's.
"""
