"""The kernel's CPU list format (``0-3,8,10-11``), read and written (pure).

sysfs writes it for ``/sys/devices/system/node/nodeN/cpulist``, a PCI device's
``local_cpulist``, ``thread_siblings_list`` and ``/proc/<pid>/status``'s
``Cpus_allowed_list`` (lib/bitmap.c ``bitmap_print_to_pagebuf`` with ``%*pbl``); ``taskset -c``
and ``numactl --physcpubind`` read it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

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
