"""Frozen value types shared by every layer.

Units live in field names (``memory_total_bytes``); ``None`` always means *unknown*, never 0.
Devices are identified physically (PCI address, UUID); ordinals appear only when a child's
environment is written (see :mod:`xpulaunch.core.env`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping


# Variables the supervisor adds to a child's environment when it starts it: their values exist
# only then (the job, the worker, the attempt). A plan lists their names as "set at start".
JOB_ID_VAR = "XPULAUNCH_JOB_ID"
WORKER_VAR = "XPULAUNCH_WORKER"
RESTART_COUNT_VAR = "TORCHELASTIC_RESTART_COUNT"
ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"  # where torch's @record writes the exception
HEARTBEAT_FILE_VAR = "XPULAUNCH_HEARTBEAT_FILE"  # touched by xpulaunch.heartbeat()
# Only with --heartbeat: the file xpulaunch.heartbeat() touches.
SET_AT_START = (JOB_ID_VAR, WORKER_VAR, RESTART_COUNT_VAR, ERROR_FILE_VAR, HEARTBEAT_FILE_VAR)
# Known when the plan is made (from the restart policy), so the plan holds it.
MAX_RESTARTS_VAR = "TORCHELASTIC_MAX_RESTARTS"
# The CPUs a worker is bound to (--cpu-bind), in the kernel's list format; processes.spawn
# binds the child to them before it executes its program.
CPUS_VAR = "XPULAUNCH_CPUS"


class Vendor(str, Enum):
    NVIDIA = "nvidia"
    INTEL = "intel"
    AMD = "amd"


class Backend(str, Enum):
    """Which vendor stack a job runs on."""

    CUDA = "cuda"
    XPU = "xpu"
    ROCM = "rocm"
    CPU = "cpu"

    @property
    def vendor(self) -> Vendor | None:
        return _BACKEND_VENDOR.get(self)


_BACKEND_VENDOR = {Backend.CUDA: Vendor.NVIDIA, Backend.XPU: Vendor.INTEL, Backend.ROCM: Vendor.AMD}


class Hierarchy(str, Enum):
    """Level Zero device hierarchy (``ZE_FLAT_DEVICE_HIERARCHY``)."""

    FLAT = "FLAT"
    COMPOSITE = "COMPOSITE"
    COMBINED = "COMBINED"

    @property
    def hands_out_tiles(self) -> bool:
        return self is not Hierarchy.COMPOSITE


class CpuBind(str, Enum):
    """``--cpu-bind``: which CPUs each rank runs on (:mod:`xpulaunch.core.cpu_bind`)."""

    NONE = "none"
    NUMA = "numa"
    EXCLUSIVE = "exclusive"


class DeviceMap(str, Enum):
    """What a single process spanning the selection should use (accelerate names)."""

    BALANCED = "balanced"
    BALANCED_LOW_0 = "balanced_low_0"
    SEQUENTIAL = "sequential"


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One NVIDIA MIG instance."""

    uuid: str
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Device:
    """One physical accelerator card, as in the inventory document (docs/CONTRACT.md, section 3)."""

    vendor: Vendor
    index: int
    name: str | None = None
    pci_bus_id: str | None = None
    uuid: str | None = None
    integrated: bool = False
    tiles: int = 1
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    utilization_percent: float | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    # Keys of the document we do not model (driver versions, device ids ...), kept for dumps.
    extra: Mapping[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        """Stable physical identity: PCI address, else UUID, else vendor and index."""
        return self.pci_bus_id or self.uuid or f"{self.vendor.value}:{self.index}"

    @property
    def memory_free_bytes(self) -> int | None:
        if self.memory_total_bytes is None or self.memory_used_bytes is None:
            return None
        return max(self.memory_total_bytes - self.memory_used_bytes, 0)

    def label(self) -> str:
        """Short human name: ``nvidia 0 (0000:00:06.0)``."""
        where = self.pci_bus_id or self.uuid
        return f"{self.vendor.value} {self.index}" + (f" ({where})" if where else "")


@dataclass(frozen=True, slots=True)
class Problem:
    """Something a probe could not measure or a source that failed. Never swallowed."""

    source: str
    message: str
    device: str | None = None

    def __str__(self) -> str:
        where = f" [{self.device}]" if self.device else ""
        return f"{self.source}{where}: {self.message}"


@dataclass(frozen=True, slots=True)
class Inventory:
    """Every accelerator of a host, plus what could not be measured."""

    devices: tuple[Device, ...] = ()
    problems: tuple[Problem, ...] = ()
    extra: Mapping[str, object] = field(default_factory=dict, compare=False, hash=False)

    def of(self, vendor: Vendor) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.vendor is vendor)


@dataclass(frozen=True, slots=True)
class Unit:
    """What is handed out: a whole card, one tile of an Intel card under FLAT/COMBINED, or one
    MIG instance of an NVIDIA GPU in MIG mode (what a CUDA process can use)."""

    device: Device
    tile: int | None = None
    mig: MigDevice | None = None

    @property
    def key(self) -> str:
        """Lease key: the card's key, with ``/tileN`` for a tile or ``/MIG-...`` for an
        instance, so that a lease on the card covers its parts."""
        if self.mig is not None:
            return f"{self.device.key}/{self.mig.uuid}"
        return self.device.key if self.tile is None else f"{self.device.key}/tile{self.tile}"

    @property
    def memory_total_bytes(self) -> int | None:
        if self.mig is not None:
            return self.mig.memory_total_bytes
        return self._share(self.device.memory_total_bytes)

    @property
    def memory_used_bytes(self) -> int | None:
        if self.mig is not None:
            return self.mig.memory_used_bytes
        return self._share(self.device.memory_used_bytes)

    @property
    def memory_free_bytes(self) -> int | None:
        if self.mig is not None:
            total, used = self.mig.memory_total_bytes, self.mig.memory_used_bytes
            return None if total is None or used is None else max(total - used, 0)
        return self._share(self.device.memory_free_bytes)

    def _share(self, card_bytes: int | None) -> int | None:
        """A tile's part of a card's figure (the card's own for the whole card)."""
        if card_bytes is None or self.tile is None:
            return card_bytes
        return card_bytes // max(self.device.tiles, 1)

    def label(self) -> str:
        base = self.device.label()
        if self.mig is not None:
            return f"{base} MIG {self.mig.uuid}"
        return base if self.tile is None else f"{base} tile {self.tile}"


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """One child process: its argv and every variable that differs from the parent's env.

    ``env`` maps a name to its new value, or to ``None`` when the child must not have it: every
    variable known when the plan is made. Only :data:`SET_AT_START` are added when the child
    starts. ``units`` are positions in :attr:`Plan.devices` this worker is meant to use.
    """

    name: str
    rank: int
    local_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str | None]
    units: tuple[int, ...] = ()

    def child_env(self, parent_env: Mapping[str, str]) -> dict[str, str]:
        """The child's environment as planned (``env`` applied to ``parent_env``), as a fresh
        dict."""
        env = dict(parent_env)
        for name, value in self.env.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """Where this machine stands in a job of several nodes (torchrun's static rendezvous).

    ``source`` says who told us: None for the command line, else the cluster environment
    (``slurm``, ``kubeflow``, ``openmpi``, ``pmi``). ``hosts``: every node's name, in node
    rank order, where the environment lists them (Slurm's node list). ``counts``: every
    node's worker count, in node rank order, once the nodes have met (empty before: then
    every node is assumed to run as many workers as this one)."""

    nnodes: int = 1
    node_rank: int = 0
    source: str | None = None
    hosts: tuple[str, ...] = ()
    counts: tuple[int, ...] = ()

    def rank_offset(self, nproc: int) -> int:
        """The global rank of this node's first worker: the workers of the nodes before it
        (torchrun's elastic agent assigns global ranks in node order the same way)."""
        if self.counts:
            return sum(self.counts[: self.node_rank])
        return self.node_rank * nproc

    def world_size(self, nproc: int) -> int:
        return sum(self.counts) if self.counts else self.nnodes * nproc


# A device holds at most this many slot jobs, whatever K or the budgets allow: each job is a
# supervisor and its workers, and a lock file of the lock directory (core.slots).
MAX_SLOTS = 64


@dataclass(frozen=True, slots=True)
class DeviceShare:
    """A job that shares its devices with other small jobs (``--slots-per-gpu``,
    ``--gpu-memory``) instead of taking them whole: at most ``slots`` jobs on each device, or
    ``memory_bytes`` of each device's memory for this job. None: no such limit."""

    slots: int | None = None
    memory_bytes: int | None = None

    def claim_bytes(self, total_bytes: int | None) -> int | None:
        """This job's share of a device with ``total_bytes`` of memory (None: unknown)."""
        if self.memory_bytes is not None:
            return self.memory_bytes
        if total_bytes is None or not self.slots:
            return None
        return total_bytes // self.slots


@dataclass(frozen=True, slots=True)
class Plan:
    """The answer to "which devices, and what does each child get?" (docs/CONTRACT.md, section
    4)."""

    backend: Backend
    devices: tuple[Unit, ...]
    workers: tuple[WorkerPlan, ...]
    device_map: DeviceMap | None
    notes: tuple[str, ...] = ()
    isolate: bool = False
    hierarchy: Hierarchy | None = None
    nodes: NodeGroup = field(default_factory=NodeGroup)
    share: DeviceShare | None = None  # None: every device is the job's alone

    @property
    def lease_keys(self) -> tuple[str, ...]:
        return tuple(u.key for u in self.devices)
