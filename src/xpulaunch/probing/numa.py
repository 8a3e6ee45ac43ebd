"""The host's CPU layout for ``--cpu-bind``: NUMA nodes, SMT siblings, allowed CPUs.

Reads ``<sys>/devices/system/node/node*/cpulist`` (without that directory, a kernel built
without NUMA: one node of ``<sys>/devices/system/cpu/online``), each CPU's
``<sys>/devices/system/cpu/cpuN/topology/thread_siblings_list`` (once per core: a sibling
already seen is not read again) and ``<proc>/self/status``'s ``Cpus_allowed_list`` (this
process's affinity, which a cpuset, taskset or Slurm may have narrowed; the probe runs in the
launcher's own process tree, so that is what its workers may use). Roots are parameters, so
tests read fixture trees. The result is the inventory's host-level ``cpu_topology``; a
device's ``numa_node`` and ``local_cpulist`` are read with its PCI directory
(:mod:`xpulaunch.probing.sysfs`).
"""

from __future__ import annotations

import os
import re

from xpulaunch.core.cpu_bind import parse_cpulist
from xpulaunch.model import Problem
from xpulaunch.probing.parsers.common import ParseError
from xpulaunch.probing.parsers.numa import parse_allowed_cpus, parse_cpus, sibling_groups
from xpulaunch.probing.sysfs import read_text

TOPOLOGY_KEY = "cpu_topology"  # the inventory's key; core.cpu_bind reads it under that name
_NODE = re.compile(r"^node([0-9]+)$")


def read_cpu_topology(
    sys_root: str, proc_root: str
) -> tuple[dict[str, object] | None, list[Problem]]:
    """``{"numa_nodes": {"0": "0-7,16-23", ...}, "smt_siblings": ["0,16", ...],
    "cpus_allowed": "0-31"}``, or None (and a problem) when no node can be read."""
    problems: list[Problem] = []
    system = os.path.join(sys_root, "devices", "system")
    nodes = _nodes(os.path.join(system, "node"), problems)
    if nodes is None:  # a kernel without CONFIG_NUMA: every online CPU on one node
        online = read_text(os.path.join(system, "cpu", "online"), problems, "numa")
        cpus = _cpus(online, f"{system}/cpu/online", problems)
        nodes = {"0": cpus} if cpus else {}
    if not nodes:
        return None, problems
    every = sorted(set().union(*(parse_cpulist(c) for c in nodes.values())))
    siblings = _siblings(os.path.join(sys_root, "devices", "system", "cpu"), every, problems)
    topology: dict[str, object] = {"numa_nodes": nodes, "smt_siblings": siblings}
    topology["cpus_allowed"] = _allowed(os.path.join(proc_root, "self", "status"), problems)
    return topology, problems


def _nodes(node_dir: str, problems: list[Problem]) -> dict[str, str] | None:
    """Node number -> its CPUs; None when the directory does not exist."""
    try:
        names = os.listdir(node_dir)
    except FileNotFoundError:
        return None
    except OSError as exc:
        problems.append(Problem("numa", f"cannot list {node_dir}: {exc.strerror or exc}"))
        return {}
    nodes: dict[str, str] = {}
    for name in sorted((n for n in names if _NODE.match(n)), key=lambda n: int(n[4:])):
        text = read_text(os.path.join(node_dir, name, "cpulist"), problems, "numa")
        cpus = _cpus(text, f"{node_dir}/{name}/cpulist", problems)
        if cpus:  # a memory-only node (CXL, HBM) has no CPU to bind to
            nodes[name[4:]] = cpus
    return nodes


def _siblings(cpu_dir: str, cpus: list[int], problems: list[Problem]) -> list[str]:
    found: dict[int, str] = {}
    seen: set[int] = set()
    for cpu in cpus:
        if cpu in seen:
            continue
        path = os.path.join(cpu_dir, f"cpu{cpu}", "topology", "thread_siblings_list")
        text = read_text(path, problems, "numa")
        group = _cpus(text, path, problems)
        if group:
            found[cpu] = group
            seen |= parse_cpulist(group)
    return sibling_groups(found)


def _allowed(status_path: str, problems: list[Problem]) -> str | None:
    text = read_text(status_path, problems, "numa")
    try:
        return None if text is None else parse_allowed_cpus(text)
    except ParseError as exc:
        problems.append(Problem("numa", f"{status_path}: Cpus_allowed_list: {exc}"))
        return None


def _cpus(text: str | None, path: str, problems: list[Problem]) -> str | None:
    if text is None:
        return None
    try:
        return parse_cpus(text) or None
    except ParseError as exc:
        problems.append(Problem("numa", f"{path}: {exc}"))
        return None
