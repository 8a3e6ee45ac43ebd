"""How GPUs are linked, from the vendors' own tables and from sysfs paths. Pure.

- ``nvidia-smi topo -m``: a tab-separated matrix, a header row of ``GPU0 .. GPUn`` (and NICs)
  then ``CPU Affinity``, ``NUMA Affinity``, ``GPU NUMA ID``; one row a device; cells ``X``,
  ``NV#``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS`` (``SOC`` in old drivers); a legend
  after a blank line. The header may be underlined with ANSI escapes.
- ``xpu-smi topology -m`` (1.x): a space-aligned matrix of tiles ``GPU d/t`` (device id, tile)
  with cells ``S``, ``MDF`` (tiles of one card), ``XL`` and the Xe Link port numbers, ``XL*``
  (reached through another card's Xe Link), ``NODE``, ``SYS``, and a ``CPU Affinity`` column
  (xpumanager ``cli/src/comlet_topology.cpp``).
- a PCI device's sysfs path: ``/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:18:00.0``
  names the host bridge and every bridge above the device.

docs/topology-formats.md has samples of each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from xpulaunch.core.device_ids import normalize_bus_id
from xpulaunch.probing.parsers.common import ParseError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}$")
_NVIDIA_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_XPU_CELL = re.compile(r"S(?=\s)|MDF|XL\*|XL(?:[ ]?\d+(?:,\d+)*)?|SYS|NODE|PIX|PXB|PHB|Unknown")
_XPU_LABEL = re.compile(r"GPU (\d+)/(\d+)")


def pci_path(resolved: str) -> list[str] | None:
    """The host bridge and the bridges above a device, from the resolved path of its
    ``/sys/bus/pci/devices/BDF`` link; None when the path holds no PCI host bridge."""
    parts = [p for p in resolved.split("/") if p]
    starts = [i for i, p in enumerate(parts) if _HOST_BRIDGE.match(p)]
    if not starts:
        return None
    chain = parts[starts[-1] : -1]
    bridges = [normalize_bus_id(p) for p in chain[1:]]
    if None in bridges:
        return None
    return [chain[0].lower(), *(b for b in bridges if b is not None)]


@dataclass(frozen=True, slots=True)
class NvidiaTopology:
    """``nvidia-smi topo -m``: cells between GPU indices, and each GPU's affinities."""

    cells: dict[tuple[int, int], str] = field(default_factory=dict)
    cpu_affinity: dict[int, str] = field(default_factory=dict)
    numa_affinity: dict[int, int | None] = field(default_factory=dict)


def parse_nvidia_topo(text: str) -> NvidiaTopology:
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if "GPU0" in line), None)
    if header_at is None:
        raise ParseError("nvidia-smi topo -m: no header row naming GPU0")
    names = [n.strip() for n in lines[header_at].split("\t")[1:]]
    columns = [n for n in names if n not in ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")]
    topology = NvidiaTopology()
    for line in lines[header_at + 1 :]:
        if not line.strip():
            break  # the legend follows a blank line
        cells = [c.strip() for c in line.split("\t")]
        row = _gpu_number(cells[0])
        if row is None:
            continue  # a NIC's row
        values = cells[1 : 1 + len(columns)]
        for name, cell in zip(columns, values, strict=False):
            col = _gpu_number(name)
            if col is not None and _NVIDIA_CELL.match(cell):
                topology.cells[(row, col)] = "SYS" if cell == "SOC" else cell
        rest = cells[1 + len(columns) :]
        if rest and rest[0] and rest[0] != "N/A":
            topology.cpu_affinity[row] = rest[0]
        if len(rest) > 1:
            topology.numa_affinity[row] = int(rest[1]) if rest[1].isdigit() else None
    if not topology.cells:
        raise ParseError("nvidia-smi topo -m: no GPU rows under the header")
    return topology


def _gpu_number(name: str) -> int | None:
    return int(name[3:]) if name.startswith("GPU") and name[3:].isdigit() else None


@dataclass(frozen=True, slots=True)
class XpuTopology:
    """``xpu-smi topology -m``: cells between (device id, tile) pairs, and each tile's CPU
    affinity."""

    cells: dict[tuple[tuple[int, int], tuple[int, int]], str] = field(default_factory=dict)
    cpu_affinity: dict[tuple[int, int], str] = field(default_factory=dict)

    def xe_link_ports(self) -> dict[tuple[int, int], int]:
        """Direct Xe Link ports between two cards (device ids, lower first), summed over their
        tiles; ``XL*`` (through a third card) is not a direct link."""
        ports: dict[tuple[int, int], int] = {}
        for (a, b), cell in self.cells.items():
            if a[0] < b[0] and cell.startswith("XL") and cell != "XL*":
                listed = cell[2:].strip()
                count = len(listed.split(",")) if listed else 1
                ports[(a[0], b[0])] = ports.get((a[0], b[0]), 0) + count
        return ports


def parse_xpu_smi_topology(text: str) -> XpuTopology:
    lines = [line for line in text.splitlines() if line.strip()]
    header_at = next((i for i, line in enumerate(lines) if "CPU Affinity" in line), None)
    if header_at is None:
        raise ParseError("xpu-smi topology -m: no header row with 'CPU Affinity'")
    tiles = [(int(d), int(t)) for d, t in _XPU_LABEL.findall(lines[header_at])]
    topology = XpuTopology()
    for line in lines[header_at + 1 :]:
        label = _XPU_LABEL.match(line.strip())
        if label is None:
            continue
        row = (int(label.group(1)), int(label.group(2)))
        rest = line.strip()[label.end() :]
        for col in tiles:
            rest = rest.lstrip()
            cell = _XPU_CELL.match(rest)
            if cell is None:
                raise ParseError(f"xpu-smi topology -m: cannot read {rest[:20]!r} of {row}")
            topology.cells[(row, col)] = cell.group(0).strip()
            rest = rest[cell.end() :]
        if rest.strip():
            topology.cpu_affinity[row] = rest.strip()
    if not topology.cells:
        raise ParseError("xpu-smi topology -m: no GPU rows under the header")
    return topology
