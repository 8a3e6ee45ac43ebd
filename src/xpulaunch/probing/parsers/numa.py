"""sysfs's NUMA and CPU topology files, as text in, values out (pure).

``numa_node`` of a PCI device: the node number, or ``-1`` where the firmware does not say
(drivers/pci/pci-sysfs.c prints ``dev->numa_node``; common in VMs and on one-node hosts).
``local_cpulist``, a node's ``cpulist`` and a CPU's ``thread_siblings_list`` are the kernel's
CPU list format; ``/proc/self/status`` gives ``Cpus_allowed_list`` in it too
(Documentation/filesystems/proc.rst).
"""

from __future__ import annotations

from xpulaunch.core.cpu_bind import format_cpulist, parse_cpulist
from xpulaunch.probing.parsers.common import ParseError


def parse_numa_node(text: str) -> int | None:
    """``"1\\n"`` -> 1; ``"-1"`` (no node known) -> None."""
    try:
        node = int(text.strip())
    except ValueError:
        raise ParseError(f"numa_node holds {text.strip()!r}, not a node number") from None
    return node if node >= 0 else None


def parse_cpus(text: str) -> str:
    """A CPU list as the inventory records it: validated and written back canonically."""
    try:
        return format_cpulist(parse_cpulist(text))
    except ValueError as exc:
        raise ParseError(str(exc)) from None


def parse_allowed_cpus(status: str) -> str | None:
    """``Cpus_allowed_list`` of a ``/proc/<pid>/status`` text; None when it has none."""
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == "Cpus_allowed_list":
            return parse_cpus(value)
    return None


def sibling_groups(siblings: dict[int, str]) -> list[str]:
    """CPU -> its ``thread_siblings_list`` text, as distinct groups ordered by first CPU."""
    groups = {parse_cpulist(text) for text in siblings.values()}
    return [format_cpulist(g) for g in sorted((g for g in groups if g), key=min)]
