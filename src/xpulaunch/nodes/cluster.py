"""``--nnodes auto``: this node's place in the job, from the cluster's own environment.

One xpulaunch runs per node (``srun --ntasks-per-node=1``, one PyTorchJob pod per node, one
MPI rank per node); each finds how many nodes there are, which one it is, and where node 0
is, in the variables its scheduler sets:

- Slurm (``srun.1``): ``SLURM_STEP_NUM_NODES``/``SLURM_NNODES``, ``SLURM_NODEID``,
  ``SLURM_STEP_NODELIST``/``SLURM_JOB_NODELIST`` (node 0 is the first host of the list).
- Kubeflow PyTorchJob: the operator sets torchrun's own ``PET_NNODES``, ``PET_NODE_RANK``,
  ``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` and also ``MASTER_ADDR``, ``MASTER_PORT``,
  ``WORLD_SIZE`` (pods) and ``RANK`` (this pod).
- Open MPI (``OMPI_COMM_WORLD_SIZE``/``_RANK``) and PMI launchers such as MPICH and Intel MPI
  (``PMI_SIZE``/``PMI_RANK``): they name no node 0, so ``MASTER_ADDR`` or ``--master-addr``
  must.

Pure: a function of the environment; ``MASTER_ADDR``/``MASTER_PORT`` in it win over what a
scheduler implies, and the command line wins over both (the caller decides that).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from xpulaunch.errors import UsageError
from xpulaunch.nodes.hostlist import expand_hostlist


@dataclass(frozen=True, slots=True)
class ClusterJob:
    """What the environment says; ``master_*`` None where it names none."""

    source: str
    nnodes: int
    node_rank: int
    master_addr: str | None = None
    master_port: int | None = None
    hosts: tuple[str, ...] = ()


Expander = Callable[[str], tuple[str, ...]]


def find_cluster(env: Mapping[str, str], expand: Expander = expand_hostlist) -> ClusterJob | None:
    """The job this node belongs to; None where no cluster environment is found. Raises
    :class:`UsageError` when the one found is not one xpulaunch per node. ``expand`` turns a
    Slurm host list into hosts (the caller may cross-check with ``scontrol``)."""
    for detector in _DETECTORS:
        found = detector(env, expand)
        if found is not None:
            return found
    return None


def _slurm(env: Mapping[str, str], expand: Expander) -> ClusterJob | None:
    if "SLURM_JOB_ID" not in env or "SLURM_NNODES" not in env:
        return None
    if "SLURM_STEP_ID" not in env and _int(env, "SLURM_NNODES") > 1:
        raise UsageError(
            "--nnodes auto: this is the Slurm batch script, which runs on the first node "
            "only; start one xpulaunch per node with srun --ntasks-per-node=1 xpulaunch ..."
        )
    nnodes = _int(env, "SLURM_STEP_NUM_NODES" if "SLURM_STEP_NUM_NODES" in env else "SLURM_NNODES")
    tasks = env.get("SLURM_STEP_NUM_TASKS")
    if tasks is not None and _int(env, "SLURM_STEP_NUM_TASKS") != nnodes:
        raise UsageError(
            f"--nnodes auto: this Slurm step runs {tasks} tasks on {nnodes} node(s); xpulaunch "
            "starts the workers itself, so run one task per node: srun --ntasks-per-node=1"
        )
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    hosts = expand(nodelist) if nodelist else ()
    if hosts and len(hosts) != nnodes:
        raise UsageError(
            f"--nnodes auto: Slurm's node list {nodelist!r} names {len(hosts)} host(s) "
            f"but the step has {nnodes} node(s)"
        )
    return _checked(
        ClusterJob(
            source="slurm",
            nnodes=nnodes,
            node_rank=_int(env, "SLURM_NODEID"),
            master_addr=env.get("MASTER_ADDR") or (hosts[0] if hosts else None),
            master_port=_port(env) or slurm_port(_int(env, "SLURM_JOB_ID")),
            hosts=hosts,
        )
    )


def slurm_port(job_id: int) -> int:
    """A port every node of Slurm job ``job_id`` agrees on without talking, and that two jobs
    sharing a node rarely both pick: 20000-29999, by job id (as torchtitan's and Lightning's
    Slurm recipes do)."""
    return 20000 + job_id % 10000


def _kubeflow(env: Mapping[str, str], expand: Expander) -> ClusterJob | None:
    if "PET_NNODES" not in env:
        return None
    nnodes_text = env["PET_NNODES"]
    if ":" in nnodes_text:
        raise UsageError(
            f"--nnodes auto: PET_NNODES={nnodes_text} asks for an elastic job; xpulaunch "
            "runs static multi-node jobs: give the PyTorchJob a fixed number of replicas"
        )
    rank_var = "PET_NODE_RANK" if "PET_NODE_RANK" in env else "RANK"
    return _checked(
        ClusterJob(
            source="kubeflow",
            nnodes=_int(env, "PET_NNODES"),
            node_rank=_int(env, rank_var),
            master_addr=env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR") or None,
            master_port=_port(env, "PET_MASTER_PORT") or _port(env),
        )
    )


Detector = Callable[[Mapping[str, str], Expander], ClusterJob | None]


def _mpi(size_var: str, rank_var: str, source: str) -> Detector:
    def detect(env: Mapping[str, str], expand: Expander) -> ClusterJob | None:
        if size_var not in env:
            return None
        return _checked(
            ClusterJob(
                source=source,
                nnodes=_int(env, size_var),
                node_rank=_int(env, rank_var),
                master_addr=env.get("MASTER_ADDR") or None,
                master_port=_port(env),
            )
        )

    return detect


_DETECTORS = (
    _slurm,
    _kubeflow,
    _mpi("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "openmpi"),
    _mpi("PMI_SIZE", "PMI_RANK", "pmi"),
)


def _checked(job: ClusterJob) -> ClusterJob:
    if job.nnodes < 1 or not 0 <= job.node_rank < job.nnodes:
        raise UsageError(
            f"--nnodes auto: {job.source} says node {job.node_rank} of {job.nnodes}; "
            "a node rank must be 0 to nnodes - 1"
        )
    return job


def _int(env: Mapping[str, str], name: str) -> int:
    text = env.get(name, "")
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{name}={text!r}: expected a whole number") from None


def _port(env: Mapping[str, str], name: str = "MASTER_PORT") -> int | None:
    if not env.get(name):
        return None
    port = _int(env, name)
    if not 1 <= port <= 65535:
        raise UsageError(f"{name}={port}: expected a port 1-65535")
    return port
