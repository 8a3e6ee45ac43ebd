"""The KFD topology (``/sys/class/kfd/kfd/topology/nodes/N``): one node per ROCr agent.

A partitioned AMD Instinct card (MI300X/MI300A/MI325 in DPX, TPX, QPX or CPX) shows one PCI
function in sysfs but one KFD GPU node per partition, and ROCr makes one agent of each, in node
order: ``ROCR_VISIBLE_DEVICES`` indices and ``GPU-`` UUIDs name partitions, not cards.
``location_id`` is the card's ``pci_dev_id`` (bus << 8 | devfn) with the partition number ORed
in by kfd_topology.c when a card has several nodes: into the function bits in the kernels that
first supported GC 9.4.3 (``location_id |= node_id``; rocm-smi then shows ``0000:01:00.1`` for
partition 1), into bits 31..28 in later ones ("node id = location_id[31:28]"). The GPU itself
is always function 0, so both spellings read back. ROCr spells an agent's UUID ``GPU-`` +
``unique_id`` as 16 hex digits (a rocminfo sample shows ``GPU-dc91284879207f2b``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# mem_banks heap types that are device memory: HSA_HEAPTYPE_FRAME_BUFFER_PUBLIC / _PRIVATE.
_VRAM_HEAPS = (1, 2)
# io_links "type" of an XGMI link (kfd_crat.h CRAT_IOLINK_TYPE_XGMI); kfd_topology.c weighs it
# 15 a hop (a PCIe link 20). Links to CPU nodes and PCIe links are not GPU links.
XGMI_LINK_TYPE = 11


@dataclass(frozen=True, slots=True)
class KfdNode:
    """One KFD topology node that is a GPU (``simd_count`` > 0)."""

    node: int
    unique_id: int | None
    domain: int
    location_id: int
    vram_bytes: int | None = None
    # io_links/N/properties of this node as (type, node_to, weight)
    io_links: tuple[tuple[int, int, int], ...] = ()

    @property
    def card_bus_id(self) -> str:
        """The PCI address of the card this node (or partition) belongs to."""
        bus, devfn = (self.location_id >> 8) & 0xFF, self.location_id & 0xFF
        return f"{self.domain:04x}:{bus:02x}:{devfn >> 3:02x}.0"

    @property
    def partition(self) -> int:
        high = (self.location_id >> 28) & 0xF
        return high or self.location_id & 0x7

    @property
    def rocr_uuid(self) -> str | None:
        return f"GPU-{self.unique_id:016x}" if self.unique_id else None


def parse_properties(text: str) -> dict[str, int]:
    """``name value`` lines (kfd_topology.c sysfs_show_*_prop) -> integers."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        try:
            values[name] = int(value.strip())
        except ValueError:
            continue
    return values


def gpu_node(
    node: int,
    properties: dict[str, int],
    bank_sizes: list[dict[str, int]],
    io_links: Sequence[Mapping[str, int]] = (),
) -> KfdNode | None:
    """A node's properties and its mem_banks' properties -> a GPU node (None for a CPU node)."""
    if properties.get("simd_count", 0) <= 0:
        return None
    vram = [b.get("size_in_bytes", 0) for b in bank_sizes if b.get("heap_type") in _VRAM_HEAPS]
    return KfdNode(
        node=node,
        unique_id=properties.get("unique_id"),
        domain=properties.get("domain", 0),
        location_id=properties.get("location_id", 0),
        vram_bytes=sum(vram) if vram else None,
        io_links=tuple(
            (link.get("type", 0), link.get("node_to", -1), link.get("weight", 0))
            for link in io_links
        ),
    )


def by_card(nodes: list[KfdNode]) -> dict[str, list[KfdNode]]:
    """GPU nodes grouped by card, each group in node order (ROCr's agent order)."""
    cards: dict[str, list[KfdNode]] = {}
    for node in sorted(nodes, key=lambda n: n.node):
        cards.setdefault(node.card_bus_id, []).append(node)
    return cards


def xgmi_links(nodes: list[KfdNode]) -> dict[str, list[dict[str, object]]]:
    """Each card's XGMI links to other cards (the inventory's ``links``), from its nodes'
    io_links: the peer's PCI address, and the KFD weight (15 a hop)."""
    card_of = {n.node: n.card_bus_id for n in nodes}
    links: dict[str, dict[str, dict[str, object]]] = {}
    for node in nodes:
        for kind, node_to, weight in node.io_links:
            peer = card_of.get(node_to)
            if kind != XGMI_LINK_TYPE or peer is None or peer == node.card_bus_id:
                continue
            mine = links.setdefault(node.card_bus_id, {})
            mine.setdefault(
                peer,
                {"kind": "xgmi", "peer": peer, "count": 1, "peer_type": "gpu", "weight": weight},
            )
    return {card: list(peers.values()) for card, peers in links.items()}
