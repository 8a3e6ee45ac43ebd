"""Did a scheduler allocate this job its GPUs? Then ``--gpus auto`` takes all of them.

On a shared workstation ``auto`` skips a busy GPU: someone else is using it. Under a
scheduler that gave the job its GPUs, a busy one is this job's own (a leftover of its last
step, a monitoring agent), and skipping it shrinks the job silently: with ``--nproc-per-node
auto`` one node then runs fewer workers than the others. So there ``auto`` takes every GPU
the job can see and warns about a busy one.

- Slurm's gres plugin sets ``SLURM_STEP_GPUS`` (in a step) or ``SLURM_JOB_GPUS`` (in the
  batch script) and the vendor's mask (``CUDA_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES``,
  ``ZE_AFFINITY_MASK``); a mask set inside a Slurm job counts too.
- Kubernetes' NVIDIA device plugin hands the container its GPUs through
  ``NVIDIA_VISIBLE_DEVICES`` (UUIDs or indices; ``all``, ``none``, ``void`` are not a
  request), in a pod (``KUBERNETES_SERVICE_HOST``).

Pure: a function of the environment.
"""

from __future__ import annotations

from collections.abc import Mapping

_SLURM_GPUS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
_MASKS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
          "ZE_AFFINITY_MASK")  # fmt: skip
_NOT_A_REQUEST = ("", "all", "none", "void")


def allocated_by(env: Mapping[str, str]) -> str | None:
    """Who allocated this job's GPUs, as a phrase naming the variable that says so
    (``Slurm (SLURM_STEP_GPUS=0,1)``); None where nobody did."""
    if "SLURM_JOB_ID" in env:
        for name in (*_SLURM_GPUS, *_MASKS):
            if env.get(name, "").strip():
                return f"Slurm ({name}={env[name].strip()})"
    if env.get("KUBERNETES_SERVICE_HOST"):
        request = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
        if request.lower() not in _NOT_A_REQUEST:
            return f"Kubernetes (NVIDIA_VISIBLE_DEVICES={request})"
    return None
