"""Read the KFD topology and split partitioned AMD cards into one observation per partition.

Side effects only here (reading /sys); the format and the partition rules are in
:mod:`xpulaunch.probing.parsers.kfd`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from xpulaunch.model import Problem
from xpulaunch.probing.observe import Observation
from xpulaunch.probing.parsers.kfd import (
    KfdNode,
    by_card,
    gpu_node,
    parse_properties,
    xgmi_links,
)
from xpulaunch.probing.sysfs import read_text

# sysfs attributes of a partition-capable amdgpu card (amdgpu_xcp / amdgpu_gfx.c).
COMPUTE_PARTITION_FILE = "current_compute_partition"
MEMORY_PARTITION_FILE = "current_memory_partition"


def read_kfd_nodes(sys_root: str, problems: list[Problem]) -> list[KfdNode] | None:
    """Every GPU node of the KFD topology; None when the topology cannot be listed."""
    nodes_dir = os.path.join(sys_root, "class", "kfd", "kfd", "topology", "nodes")
    try:
        names = sorted((n for n in os.listdir(nodes_dir) if n.isdigit()), key=int)
    except OSError:
        return None
    nodes = []
    for name in names:
        path = os.path.join(nodes_dir, name)
        properties = parse_properties(read_text(os.path.join(path, "properties"), problems) or "")
        links = _properties_of(os.path.join(path, "io_links"), problems)
        node = gpu_node(int(name), properties, _banks(path, problems), links)
        if node is not None:
            nodes.append(node)
    return nodes


def _banks(node_path: str, problems: list[Problem]) -> list[dict[str, int]]:
    return _properties_of(os.path.join(node_path, "mem_banks"), problems)


def _properties_of(banks_dir: str, problems: list[Problem]) -> list[dict[str, int]]:
    """The ``properties`` of every entry of a node's ``mem_banks`` or ``io_links``."""
    try:
        names = sorted(os.listdir(banks_dir))
    except OSError:
        return []
    texts = (read_text(os.path.join(banks_dir, n, "properties"), problems) for n in names)
    return [parse_properties(t or "") for t in texts]


def partition_mode(card_path: str, problems: list[Problem]) -> str | None:
    """``CPX/NPS4`` style: the compute and memory partition modes a card reports, if any."""
    modes = [
        read_text(os.path.join(card_path, f), problems)
        for f in (COMPUTE_PARTITION_FILE, MEMORY_PARTITION_FILE)
    ]
    shown = [m for m in modes if m]
    return "/".join(shown) if shown else None


def split_partitions(
    card: Observation, nodes: list[KfdNode] | None, mode: str | None
) -> tuple[list[Observation], list[Problem]]:
    """One observation per partition of ``card`` (the card itself when it has one).

    A partition's PCI address is the card's with the partition number as function, as
    rocm-smi and amd-smi show it; its UUID is ROCr's when every partition of the card has its
    own (before ROCm 7.0.1 partitions share the card's, and ROCr refuses an ambiguous UUID).
    """
    mine = by_card(nodes or []).get(card.pci_bus_id or "", [])
    if len(mine) <= 1:
        if mode and mode.split("/")[0] not in ("SPX", "") and nodes is None:
            unknown = {**card.extra, "partition_mode": mode, "partitions_unknown": True}
            return [replace(card, extra=unknown)], [_unreadable(card, mode)]
        uuid = mine[0].rocr_uuid if mine else None
        return [replace(card, uuid=card.uuid or uuid)], []
    uuids = [n.rocr_uuid for n in mine]
    distinct = None not in uuids and len(set(uuids)) == len(uuids)
    problems = [] if distinct else [_shared_uuid(card, mode, len(mine))]
    facts = {"partitions": len(mine), "partition_mode": mode, "card_pci_bus_id": card.pci_bus_id}
    numbers = [n.partition for n in mine]
    if len(set(numbers)) != len(numbers) or max(numbers) > 7:  # then node order numbers them
        numbers = list(range(len(mine)))
    return [
        _partition(card, node, number, facts, distinct=distinct)
        for node, number in zip(mine, numbers, strict=True)
    ], problems


def _partition(
    card: Observation, node: KfdNode, number: int, facts: Mapping[str, object], *, distinct: bool
) -> Observation:
    base = (card.pci_bus_id or "0000:00:00.0")[:-1]
    extra = {**card.extra, **facts, "partition": number, "kfd_node": node.node}
    if not distinct and node.rocr_uuid:
        extra["rocr_uuid_shared"] = node.rocr_uuid  # what ROCr refuses as ambiguous
    return replace(
        card,
        pci_bus_id=f"{base}{number}",
        uuid=node.rocr_uuid if distinct else None,
        memory_total_bytes=node.vram_bytes,
        memory_used_bytes=None,  # mem_info_vram_used is the card's, not a partition's
        utilization_percent=None,
        extra=extra,
    )


def _unreadable(card: Observation, mode: str) -> Problem:
    return Problem(
        "kfd",
        f"card in {mode} mode but /sys/class/kfd/kfd/topology cannot be read: its partitions "
        "cannot be told apart, so xpulaunch will not hand it out",
        card.pci_bus_id,
    )


def _shared_uuid(card: Observation, mode: str | None, count: int) -> Problem:
    return Problem(
        "kfd",
        f"the {count} partitions ({mode or 'partitioned'}) share one ROCr UUID (ROCm before "
        "7.0.1): masks name them by index",
        card.pci_bus_id,
    )


def with_xgmi_links(cards: list[Observation], nodes: list[KfdNode] | None) -> list[Observation]:
    """Each card with its XGMI links (io_links of type XGMI to another card's node); a
    partition is linked as its card is (its links are its card's)."""
    links = xgmi_links(nodes or [])
    if not links:
        return cards
    linked = []
    for card in cards:
        card_bus = card.extra.get("card_pci_bus_id", card.pci_bus_id)
        mine = links.get(card_bus) if isinstance(card_bus, str) else None
        linked.append(card if mine is None else replace(card, extra={**card.extra, "links": mine}))
    return linked
