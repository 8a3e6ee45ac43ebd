"""``--cpu-bind none|numa|exclusive``: the CPUs each rank runs on, near its devices (pure).

A rank whose threads run on the far socket pays on every host-device copy and in its data
loaders. The inventory records each device's NUMA node (sysfs ``numa_node``, its
``local_cpulist`` as a fallback) and the host's layout (each node's ``cpulist``, the SMT
sibling groups, the CPUs the probing process may use): ``numa`` binds a rank to the CPUs of
its devices' NUMA node; ``exclusive`` splits that node's physical cores among the ranks on it,
SMT siblings together, the first ranks one core more when they do not divide evenly (the
rules of torchrun's ``--numa-binding node`` and ``exclusive``, torch/numa/binding.py, for
every vendor). A rank's ``OMP_NUM_THREADS`` follows the cores it gets. The binding travels as
:data:`CPUS_VAR` in the worker's environment; :mod:`xpulaunch.processes.spawn` applies it in
the child before the program is executed, so the program and its children inherit it.

CPU sets are read and written in the kernel's CPU list format (``0-3,8,10-11``): sysfs writes
it for ``/sys/devices/system/node/nodeN/cpulist``, a PCI device's ``local_cpulist``,
``thread_siblings_list`` and ``/proc/<pid>/status``'s ``Cpus_allowed_list``
(lib/bitmap.c ``bitmap_print_to_pagebuf`` with ``%*pbl``); ``taskset -c`` and ``numactl
--physcpubind`` read it (:func:`parse_cpulist`, :func:`format_cpulist`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping  # also at run time: isinstance checks
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpulaunch.errors import InventoryError, SelectionError, UsageError
from xpulaunch.model import CPUS_VAR, CpuBind

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from xpulaunch.model import Device, Inventory, Unit

__all__ = [
    "CPUS_VAR",
    "TOPOLOGY_KEY",
    "Binding",
    "CpuBind",
    "CpuTopology",
    "bind_workers",
    "format_cpulist",
    "from_torchrun",
    "parse_cpulist",
]

TOPOLOGY_KEY = "cpu_topology"  # the inventory's host-level key (probing.numa writes it)


# A bound far above any machine (the kernel's NR_CPUS is at most 8192), far below what makes
# a list like "0-999999999" a problem.
MAX_CPU = 65535
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def parse_cpulist(text: str) -> frozenset[int]:
    """``"0-2,4"`` -> ``{0, 1, 2, 4}``; ``""`` -> the empty set. Raises ``ValueError`` with the
    part that is not a CPU number or range."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.strip().split(",")):
        if not part:
            continue
        match = _RANGE.fullmatch(part)
        first = int(match[1]) if match else -1
        last = int(match[2]) if match and match[2] is not None else first
        if match is None or last < first or last > MAX_CPU:
            raise ValueError(f"{part!r} is not a CPU number or range (like 0-3) up to {MAX_CPU}")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """``{0, 1, 2, 4}`` -> ``"0-2,4"`` (ascending, ranges merged)."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def parse_cpu_bind(value: str | CpuBind | None) -> CpuBind:
    try:
        return CpuBind((value or "none").strip().lower())
    except ValueError:
        raise UsageError(
            "expected none, numa or exclusive", option="cpu_bind", value=value, malformed=True
        ) from None


# torchrun --numa-binding (torch/numa/binding.py AffinityMode) -> ours, with what differs.
_TORCHRUN = {
    "node": (CpuBind.NUMA, None),
    "socket": (
        CpuBind.NUMA,
        "torchrun's socket binds to every NUMA node of the GPU's socket; xpulaunch binds to "
        "the GPU's node, the same where a socket is one node (narrower with SNC or NPS modes)",
    ),
    "exclusive": (CpuBind.EXCLUSIVE, None),
    "core-complex": (
        CpuBind.EXCLUSIVE,
        "torchrun's core-complex gives each rank one L3 cache domain of the GPU's node; "
        "xpulaunch gives each rank its own share of the node's cores",
    ),
}


def from_torchrun(value: str) -> tuple[CpuBind, str | None]:
    """``torchrun --numa-binding VALUE`` as ``--cpu-bind``, with a note where they differ."""
    try:
        return _TORCHRUN[value.strip().lower()]
    except KeyError:
        raise UsageError(
            f"expected one of {', '.join(_TORCHRUN)}", option="numa_binding", value=value
        ) from None


@dataclass(frozen=True, slots=True)
class CpuTopology:
    """The host's CPUs as the inventory records them."""

    nodes: Mapping[int, frozenset[int]]  # NUMA node -> its CPUs
    cores: tuple[frozenset[int], ...] = ()  # SMT sibling groups; none known: a CPU each
    allowed: frozenset[int] | None = None  # what the probing process may run on

    def node_cpus(self, node: int) -> frozenset[int]:
        cpus = self.nodes.get(node, frozenset())
        return cpus if self.allowed is None else cpus & self.allowed

    def physical_cores(self, cpus: frozenset[int]) -> list[frozenset[int]]:
        """``cpus`` grouped by physical core (SMT siblings together), lowest CPU first."""
        grouped = {c: g & cpus for g in self.cores for c in g if g & cpus}
        loose = [frozenset({c}) for c in cpus if c not in grouped]
        return sorted({*grouped.values(), *loose}, key=min)


@dataclass(frozen=True, slots=True)
class Binding:
    """One worker's CPUs, the NUMA nodes they belong to, and its OMP_NUM_THREADS."""

    cpus: frozenset[int]
    nodes: tuple[int, ...]
    threads: int

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)


def topology_of(inventory: Inventory) -> CpuTopology | None:
    """The inventory's ``cpu_topology``; None when it has none. A malformed one is an error
    naming the bad key."""
    raw = inventory.extra.get(TOPOLOGY_KEY)
    if raw is None:
        return None
    where = f"inventory: {TOPOLOGY_KEY}"
    if not isinstance(raw, Mapping) or not isinstance(raw.get("numa_nodes"), Mapping):
        raise InventoryError(f"{where}: must be an object with 'numa_nodes'")
    nodes = {
        _node_number(k, where): _cpus(v, f"{where}.numa_nodes.{k}")
        for k, v in raw["numa_nodes"].items()
    }
    cores = raw.get("smt_siblings") or []
    if not isinstance(cores, list):
        raise InventoryError(f"{where}.smt_siblings: must be a list of CPU lists")
    allowed = raw.get("cpus_allowed")
    return CpuTopology(
        nodes=nodes,
        cores=tuple(_cpus(c, f"{where}.smt_siblings[{i}]") for i, c in enumerate(cores)),
        allowed=None if allowed is None else _cpus(allowed, f"{where}.cpus_allowed"),
    )


def _node_number(key: object, where: str) -> int:
    if isinstance(key, str) and key.isascii() and key.isdigit():
        return int(key)
    raise InventoryError(f"{where}.numa_nodes: key {key!r} is not a node number")


def _cpus(value: object, where: str) -> frozenset[int]:
    if not isinstance(value, str):
        raise InventoryError(f"{where}: {value!r} is not a CPU list like '0-3,8'")
    try:
        return parse_cpulist(value)
    except ValueError as exc:
        raise InventoryError(f"{where}: {exc}") from None


def device_cpus(device: Device, topology: CpuTopology) -> tuple[frozenset[int], int | None]:
    """The CPUs near ``device`` and its NUMA node: the node's CPUs when sysfs gave a node
    (``numa_node``; -1, recorded as null, means the firmware did not say), else its
    ``local_cpulist`` when that is narrower than the whole host, else nothing. A host of one
    NUMA node needs no answer from the device: every CPU is near."""
    node = device.extra.get("numa_node")
    if isinstance(node, int) and node in topology.nodes:
        return topology.node_cpus(node), node
    if len(topology.nodes) == 1:
        only = next(iter(topology.nodes))
        return topology.node_cpus(only), only
    local = device.extra.get("local_cpulist")
    every = frozenset().union(*topology.nodes.values())
    try:
        cpus = parse_cpulist(local) if isinstance(local, str) else frozenset()
    except ValueError:
        cpus = frozenset()
    if not cpus or cpus >= every:
        return frozenset(), None
    nodes = [n for n, c in topology.nodes.items() if cpus <= c]
    cpus = cpus if topology.allowed is None else cpus & topology.allowed
    return cpus, (nodes[0] if nodes else None)


def bind_workers(
    mode: CpuBind,
    used: Sequence[Sequence[Unit]],
    topology: CpuTopology | None,
) -> tuple[tuple[Binding | None, ...], tuple[str, ...]]:
    """One binding per worker (None: not bound) and the plan's notes, one per rank.

    ``used[r]``: the devices worker ``r`` works on (its own with ``--isolate``, else the one
    its LOCAL_RANK picks). Raises :class:`SelectionError` when ``exclusive`` has fewer cores
    on a node than ranks to give them to."""
    if mode is CpuBind.NONE:
        return tuple(None for _ in used), ()
    if topology is None or not topology.nodes:
        raise SelectionError(
            "needs the host's NUMA layout (/sys/devices/system/node), which this inventory "
            "does not record; probe the host again (xpulaunch devices --json) or use none",
            option="cpu_bind",
            value=mode.value,
        )
    near = [_near(units, topology) for units in used]
    notes = [
        f"warning: --cpu-bind {mode.value}: rank {rank} is not bound: {why}"
        for rank, (cpus, _, why) in enumerate(near)
        if not cpus
    ]
    bindings = _numa(near, topology) if mode is CpuBind.NUMA else _exclusive(near, topology)
    for rank, (binding, (_, _, why)) in enumerate(zip(bindings, near, strict=True)):
        if binding is not None:
            notes.append(
                f"--cpu-bind {mode.value}: rank {rank} on CPUs {binding.cpulist} "
                f"({len(topology.physical_cores(binding.cpus))} cores, {why}); "
                f"OMP_NUM_THREADS={binding.threads} unless set"
            )
    return bindings, tuple(notes)


_Near = tuple[frozenset[int], tuple[int, ...], str]  # CPUs, their nodes, why in words


def _near(units: Sequence[Unit], topology: CpuTopology) -> _Near:
    """The CPUs near all of ``units``, their nodes, and the reason in words."""
    if not units:
        return frozenset(), (), "it has no device (a CPU job has no device to be near)"
    cpus: frozenset[int] = frozenset()
    nodes: list[int] = []
    for device in dict.fromkeys(u.device for u in units):
        mine, node = device_cpus(device, topology)
        if not mine:
            why = (
                f"the NUMA node of {device.label()} is unknown (sysfs numa_node -1 and no "
                f"narrower local_cpulist) on a host of {len(topology.nodes)} NUMA nodes"
            )
            return frozenset(), (), why
        cpus |= mine
        if node is not None and node not in nodes:
            nodes.append(node)
    labels = ", ".join(dict.fromkeys(u.device.label() for u in units))
    where = "NUMA node " + ",".join(map(str, nodes)) if nodes else "local CPUs"
    return cpus, tuple(nodes), f"{where} of {labels}"


def _numa(near: Sequence[_Near], topology: CpuTopology) -> tuple[Binding | None, ...]:
    """Every rank on all CPUs near its devices; ranks that share them share the cores among
    their OpenMP threads."""
    sharing = {cpus: sum(1 for c, _, _ in near if c == cpus) for cpus, _, _ in near if cpus}
    return tuple(
        Binding(cpus, nodes, max(len(topology.physical_cores(cpus)) // sharing[cpus], 1))
        if cpus
        else None
        for cpus, nodes, _ in near
    )


def _exclusive(near: Sequence[_Near], topology: CpuTopology) -> tuple[Binding | None, ...]:
    """The cores near a group of ranks split among them, in rank order (torch's rule); a
    core already given to an earlier group (ranks whose devices span several nodes) is not
    given again."""
    from xpulaunch.core.devicemap import split_evenly  # the probe imports this module too

    bindings: list[Binding | None] = [None] * len(near)
    groups: dict[frozenset[int], list[int]] = {}
    for rank, (cpus, _, _) in enumerate(near):
        if cpus:
            groups.setdefault(cpus, []).append(rank)
    taken: frozenset[int] = frozenset()
    for cpus, ranks in groups.items():
        cores = [c for c in topology.physical_cores(cpus) if not c & taken]
        if len(cores) < len(ranks):
            raise SelectionError(
                f"{len(ranks)} ranks share {len(cores)} physical core(s) near their devices "
                f"(CPUs {format_cpulist(cpus)}); use numa, or fewer workers",
                option="cpu_bind",
                value=CpuBind.EXCLUSIVE.value,
            )
        for rank, share in zip(ranks, split_evenly(range(len(cores)), len(ranks)), strict=True):
            mine = frozenset().union(*(cores[i] for i in share))
            bindings[rank] = Binding(mine, near[rank][1], len(share))
        taken = taken.union(*cores)
    return tuple(bindings)
