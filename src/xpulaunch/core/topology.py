"""How devices are connected, and which N of them to choose for a job (``--topology``). Pure.

The inventory carries each device's connections as optional keys (docs/topology-formats.md):

- ``links``: its GPU-to-GPU links, ``[{"kind": "nvlink"|"xgmi"|"xelink", "peer": PCI
  address, "count": links, "peer_type": "gpu"|"switch"}]``. A peer of type ``switch`` is an
  NVSwitch (NVML's remote PCI info names the switch, not the GPU behind it): GPUs linked to
  switches of one fabric reach each other at their full link count.
- ``pci_path``: the PCI bridges above it, from its host bridge down (the sysfs path of
  ``/sys/bus/pci/devices/BDF``: ``["pci0000:15", "0000:15:01.0", "0000:16:00.0"]``).
- ``pcie``: where the vendor's library says so (NVML's common ancestor), the PCIe relation to
  each other GPU, as ``nvidia-smi topo -m`` writes it (``PIX``, ``PXB``, ``PHB``, ``NODE``,
  ``SYS``); it wins over what the paths say.
- ``numa_node``: its NUMA node (sysfs; null when the firmware does not say).

Two devices share a :class:`Level`: one link group (NVLink, XGMI hive, Xe Link; or the tiles
of one card), one PCIe switch (``PIX``/``PXB``: no host bridge between them), one NUMA node
(``PHB``/``NODE``), or none (``SYS``). A set's level is the lowest of its pairs'.
:func:`choose` keeps the free devices ranked first (most free memory) unless another set of
them shares a closer level; ``nvidia-smi topo -m``'s legend and NVML's
``nvmlGpuTopologyLevel_t`` name the PCIe levels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import TYPE_CHECKING

from xpulaunch.errors import SelectionError

if TYPE_CHECKING:
    from xpulaunch.model import Device, Inventory, Unit

LINKS_KEY, PCI_PATH_KEY, PCIE_KEY, NUMA_KEY = "links", "pci_path", "pcie", "numa_node"
LINK_KINDS = {"nvlink": "NVLink", "xgmi": "XGMI", "xelink": "Xe Link"}
_GROUP = {"nvlink": "NVLink group", "xgmi": "XGMI hive", "xelink": "Xe Link group"}
# The matrix cell of a link: nvidia-smi's NV#, rocm-smi's XGMI, xpu-smi's XL.
_CELL = {"nvlink": "NV{}", "xgmi": "XGMI", "xelink": "XL{}"}
PCIE_CELLS = ("PIX", "PXB", "PHB", "NODE", "SYS")


class TopologyMode(str, Enum):
    """``--topology``: prefer a closely linked set, require one, or ignore the links."""

    PREFER = "prefer"
    REQUIRE = "require"
    IGNORE = "ignore"


class Level(IntEnum):
    NONE = 0
    NUMA = 1
    SWITCH = 2
    LINK = 3


_PCIE_LEVEL = {
    "PIX": Level.SWITCH,
    "PXB": Level.SWITCH,
    "PHB": Level.NUMA,
    "NODE": Level.NUMA,
    "SYS": Level.NONE,
}


@dataclass(frozen=True, slots=True)
class Link:
    kind: str
    peer: str
    count: int = 1
    peer_type: str = "gpu"


def links_of(device: Device) -> tuple[Link, ...]:
    """The device's ``links``; entries that are not links (an old or foreign document) are
    left out."""
    raw = device.extra.get(LINKS_KEY)
    if not isinstance(raw, list):
        return ()
    found = []
    for item in raw:
        if not isinstance(item, Mapping):
            continue
        kind, peer, count = item.get("kind"), item.get("peer"), item.get("count", 1)
        if kind in LINK_KINDS and isinstance(peer, str) and isinstance(count, int):
            peer_type = "switch" if item.get("peer_type") == "switch" else "gpu"
            found.append(Link(str(kind), peer.lower(), max(count, 1), peer_type))
    return tuple(found)


def pci_path_of(device: Device) -> tuple[str, ...] | None:
    raw = device.extra.get(PCI_PATH_KEY)
    if isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
        return tuple(p.lower() for p in raw)
    return None


def numa_of(device: Device) -> int | None:
    node = device.extra.get(NUMA_KEY)
    return node if isinstance(node, int) and not isinstance(node, bool) and node >= 0 else None


def has_topology(device: Device) -> bool:
    return bool(links_of(device)) or pci_path_of(device) is not None or numa_of(device) is not None


def pcie_cell(a: Device, b: Device) -> str | None:
    """``PIX``/``PXB``/``PHB``/``NODE``/``SYS`` between two devices; None when unknown."""
    for one, other in ((a, b), (b, a)):
        told = one.extra.get(PCIE_KEY)
        if isinstance(told, Mapping) and other.key in told and told[other.key] in PCIE_CELLS:
            return str(told[other.key])
    path_a, path_b = pci_path_of(a), pci_path_of(b)
    if path_a is not None and path_b is not None:
        return _path_cell(path_a, path_b, numa_of(a), numa_of(b))
    node_a, node_b = numa_of(a), numa_of(b)
    if node_a is not None and node_b is not None:
        return "NODE" if node_a == node_b else "SYS"
    return None


def _path_cell(
    a: tuple[str, ...], b: tuple[str, ...], node_a: int | None, node_b: int | None
) -> str:
    """nvidia-smi's legend from the bridges above each device: under one host bridge, PIX
    when each is at most one bridge below the deepest bridge they share, PXB when deeper, PHB
    when they share only the host bridge; under two host bridges NODE on one NUMA node, else
    SYS."""
    if a[0] != b[0]:
        return "NODE" if node_a is not None and node_a == node_b else "SYS"
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    if common == 1:
        return "PHB"
    return "PIX" if len(a) - common <= 1 and len(b) - common <= 1 else "PXB"


class Fabric:
    """The link groups of a set of devices: devices linked to each other, or to a switch that
    another device of the group is linked to, are in one group."""

    def __init__(self, devices: Sequence[Device]) -> None:
        self._group: dict[str, str] = {}
        self._levels: dict[tuple[str, str], Level] = {}
        self._links = {d.key: links_of(d) for d in devices}
        parent: dict[str, str] = {}

        def root(key: str) -> str:
            while parent.setdefault(key, key) != key:
                key = parent[key]
            return key

        for device in devices:
            for link in self._links[device.key]:
                parent[root(link.peer)] = root(device.key)
        for device in devices:
            if self._links[device.key]:
                self._group[device.key] = root(device.key)

    def linked(self, a: Device, b: Device) -> bool:
        group = self._group.get(a.key)
        return group is not None and group == self._group.get(b.key)

    def cell(self, a: Device, b: Device) -> str | None:
        """``NV18``, ``XGMI``, ``XL4``: the link between two devices, None when not linked."""
        if not self.linked(a, b):
            return None
        direct = [link for link in self._links[a.key] if link.peer == b.key]
        direct = direct or [link for link in self._links[b.key] if link.peer == a.key]
        if direct:
            return _CELL[direct[0].kind].format(sum(link.count for link in direct))
        through = [
            sum(link.count for link in self._links[d.key] if link.peer_type == "switch")
            for d in (a, b)
        ]
        kind = self._links[a.key][0].kind
        return _CELL[kind].format(min(through)) if min(through) else None

    def level(self, a: Device, b: Device) -> Level:
        """The level two cards share, worked out once a pair (a choice asks many times)."""
        pair = (a.key, b.key)
        if pair not in self._levels:
            cell = None if self.cell(a, b) is None else "LINK"
            cell = cell or pcie_cell(a, b)
            self._levels[pair] = (
                Level.LINK if cell == "LINK" else _PCIE_LEVEL.get(cell or "SYS", Level.NONE)
            )
        return self._levels[pair]

    def kind_of(self, device: Device) -> str | None:
        links = self._links.get(device.key, ())
        return links[0].kind if links else None


def level(a: Unit, b: Unit, fabric: Fabric) -> Level:
    if a.device.key == b.device.key:
        return Level.LINK  # tiles or MIG instances of one card
    return fabric.level(a.device, b.device)


def set_level(units: Sequence[Unit], fabric: Fabric) -> Level:
    pairs = [level(a, b, fabric) for i, a in enumerate(units) for b in units[i + 1 :]]
    return min(pairs, default=Level.LINK)


@dataclass(frozen=True, slots=True)
class Choice:
    units: tuple[Unit, ...]
    notes: tuple[str, ...] = ()


def choose(
    ranked: Sequence[Unit], count: int, mode: TopologyMode, visible: Sequence[Unit]
) -> Choice:
    """``count`` of the free ``ranked`` units (best first). ``prefer``: the first ``count``
    unless another set of free units shares a closer level; ``require``: a set sharing the
    closest level any ``count`` of the ``visible`` units share (free or not), else
    :class:`SelectionError`; ``ignore``: the first ``count``."""
    first = tuple(ranked[:count])
    if mode is TopologyMode.IGNORE or count < 2 or len(ranked) < count:
        return Choice(first)
    if not any(has_topology(u.device) for u in ranked):
        if mode is TopologyMode.REQUIRE:
            raise _refusal(
                count,
                "the inventory says nothing of how these devices are linked",
                advice="probe again with this version, or use --topology prefer",
            )
        return Choice(first)
    fabric = Fabric(list(dict.fromkeys(u.device for u in visible)))
    best, best_level = _closest(ranked, count, fabric)
    first_level = set_level(first, fabric)
    chosen, chosen_level = (first, first_level) if first_level >= best_level else (best, best_level)
    if mode is TopologyMode.REQUIRE:
        _require(chosen_level, count, visible, fabric)
    notes = [f"topology: the {count} chosen devices share {describe(chosen_level, chosen, fabric)}"]
    passed = [u for u in first if u not in chosen]
    if passed:
        notes.append(
            f"topology: passed over {', '.join(u.label() for u in passed)}, ranked first by "
            f"free memory and index: the first {count} share "
            f"{describe(first_level, first, fabric)}"
        )
    return Choice(chosen, tuple(notes))


def _closest(ranked: Sequence[Unit], count: int, fabric: Fabric) -> tuple[tuple[Unit, ...], Level]:
    """The set of ``count`` units sharing the closest level, the best-ranked such set."""
    for wanted in (Level.LINK, Level.SWITCH, Level.NUMA):
        found = [s for s in (_grown(seed, ranked, count, wanted, fabric) for seed in ranked) if s]
        if found:
            return min(found, key=lambda s: sorted(ranked.index(u) for u in s)), wanted
    return tuple(ranked[:count]), Level.NONE


def _grown(
    seed: Unit, ranked: Sequence[Unit], count: int, wanted: Level, fabric: Fabric
) -> tuple[Unit, ...] | None:
    """``seed`` and the best-ranked units that share ``wanted`` with it and with each other."""
    members = [seed]
    for unit in ranked:
        if len(members) == count:
            break
        if unit is not seed and all(level(unit, m, fabric) >= wanted for m in members):
            members.append(unit)
    return tuple(members) if len(members) == count else None


def _require(chosen: Level, count: int, visible: Sequence[Unit], fabric: Fabric) -> None:
    _, possible = _closest(list(visible), count, fabric)
    if possible is Level.NONE:
        raise _refusal(
            count,
            f"no {count} devices of this host share a link, a PCIe switch or a NUMA node",
            advice="ask for fewer devices, or use --topology prefer",
        )
    if chosen < possible:
        raise _refusal(
            count,
            f"no {count} free devices share {_LEVEL_WORDS[possible]}, as {count} devices of this "
            "host do (the others are leased, busy or filtered out)",
        )


def _refusal(
    count: int, why: str, advice: str = "wait with --wait, or use --topology prefer"
) -> SelectionError:
    return SelectionError(
        f"--topology require: {why}; {advice}",
        option="gpus",
        value=str(count),
    )


_LEVEL_WORDS = {
    Level.LINK: "one link group",
    Level.SWITCH: "one PCIe switch",
    Level.NUMA: "one NUMA node",
    Level.NONE: "no link",
}


def describe(shared: Level, units: Sequence[Unit], fabric: Fabric) -> str:
    """``one NVLink group (NV18)``, ``one PCIe switch``, ``NUMA node 1``, ..."""
    devices = list(dict.fromkeys(u.device for u in units))
    if shared is Level.LINK:
        if len(devices) == 1:
            return "one card"
        kind = fabric.kind_of(devices[0]) or "nvlink"
        cells = sorted(
            {fabric.cell(a, b) or "" for i, a in enumerate(devices) for b in devices[i + 1 :]}
        )
        return f"one {_GROUP[kind]} ({', '.join(c for c in cells if c)})"
    if shared is Level.NUMA:
        nodes = {numa_of(d) for d in devices}
        return (
            f"NUMA node {nodes.pop()}" if len(nodes) == 1 and None not in nodes else "one NUMA node"
        )
    if shared is Level.SWITCH:
        return "one PCIe switch"
    return "no link, PCIe switch or NUMA node (only the CPUs' interconnect)"


def host_node(inventory: Inventory) -> int | None:
    """The NUMA node of a host that has only one (the inventory's ``cpu_topology``): every
    device is on it, even where sysfs says ``numa_node`` -1 (nvidia-smi shows NUMA affinity 0
    for such a GPU on our one-node VMs)."""
    topology = inventory.extra.get("cpu_topology")
    nodes = topology.get("numa_nodes") if isinstance(topology, Mapping) else None
    if isinstance(nodes, Mapping) and len(nodes) == 1:
        (only,) = nodes
        return int(only) if str(only).isdigit() else None
    return None


def matrix(devices: Sequence[Device], *, only_node: int | None = None) -> list[list[str]]:
    """``nvidia-smi topo -m``'s table: a header row, then one row per device of its cells to
    every device, its CPU affinity and its NUMA affinity (``?``: not known; ``only_node``: the
    host's one NUMA node, :func:`host_node`)."""
    fabric = Fabric(devices)
    mixed = len({d.vendor for d in devices}) > 1  # every vendor numbers its GPUs from 0
    names = [f"{d.vendor.value}:{d.index}" if mixed else f"GPU{d.index}" for d in devices]
    rows = [["", *names, "CPU Affinity", "NUMA Affinity"]]
    for name, a in zip(names, devices, strict=True):
        cells = [
            "X" if a.key == b.key else fabric.cell(a, b) or pcie_cell(a, b) or "?" for b in devices
        ]
        cpus = a.extra.get("local_cpulist")
        node = numa_of(a) if numa_of(a) is not None else only_node
        rows.append(
            [
                name,
                *cells,
                cpus if isinstance(cpus, str) else "?",
                "?" if node is None else str(node),
            ]
        )
    return rows


def matrix_dict(devices: Sequence[Device], *, only_node: int | None = None) -> dict[str, object]:
    """The matrix for ``devices --topology --json``: the device keys and their cells."""
    table = matrix(devices, only_node=only_node)
    return {
        "devices": [d.key for d in devices],
        "cells": [row[1 : 1 + len(devices)] for row in table[1:]],
        "cpu_affinity": [row[-2] for row in table[1:]],
        "numa_affinity": [None if row[-1] == "?" else int(row[-1]) for row in table[1:]],
    }


LEGEND = (
    "X = self; NV# = # bonded NVLinks; XGMI = AMD XGMI; XL# = # Intel Xe Link ports; "
    "PIX = at most one PCIe bridge between them; PXB = several PCIe bridges, no host bridge; "
    "PHB = through a PCIe host bridge; NODE = between host bridges of one NUMA node; "
    "SYS = across NUMA nodes; ? = not known"
)
