"""Slurm host lists: ``node[01-04,07],gpu-a[1-2]`` -> ``node01 node02 ... gpu-a2``.

The syntax is Slurm's (``scontrol show hostnames`` expands it; ``src/common/hostlist.c``): a
comma separates hosts except inside brackets; a bracket holds numbers and ranges, and a range
keeps the zero padding of its first number (``[08-10]`` -> ``08 09 10``); several bracket
groups in one name multiply out, the last varying fastest (``r[1-2]n[1-2]`` -> ``r1n1 r1n2
r2n1 r2n2``). Pure: the cross-check against ``scontrol`` lives in :mod:`xpulaunch.nodes.slurm`.
"""

from __future__ import annotations

import re

from xpulaunch.errors import UsageError

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
# Slurm refuses larger expansions too (MAX_RANGE in hostlist.c is 64K); a typo such as
# node[1-9999999] should be an error, not a list that fills the memory.
MAX_HOSTS = 65536


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Every host named by ``text``, in order. Raises :class:`UsageError` on bad syntax."""
    hosts: list[str] = []
    for item in _split_top_level(text.strip()):
        hosts.extend(_expand_item(item, text))
        if len(hosts) > MAX_HOSTS:
            raise _bad(text, f"more than {MAX_HOSTS} hosts")
    return tuple(hosts)


def _split_top_level(text: str) -> list[str]:
    """Split at the commas that are outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def _expand_item(item: str, whole: str) -> list[str]:
    if not item:
        raise _bad(whole, "an empty host name")
    open_at = item.find("[")
    if open_at < 0:
        if "]" in item:
            raise _bad(whole, f"unbalanced ']' in {item!r}")
        return [item]
    close_at = item.find("]", open_at)
    if close_at < 0:
        raise _bad(whole, f"unbalanced '[' in {item!r}")
    prefix, body, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    tails = _expand_item(rest, whole) if rest else [""]
    return [prefix + number + tail for number in _numbers(body, whole) for tail in tails]


def _numbers(body: str, whole: str) -> list[str]:
    """``01-03,7`` -> ``01 02 03 7``: ranges keep the width of their first number."""
    numbers: list[str] = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise _bad(whole, f"[{body}] holds {part!r}, not a number or a range N-M")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise _bad(whole, f"the range {part} runs backwards")
        if int(last) - int(first) >= MAX_HOSTS:
            raise _bad(whole, f"more than {MAX_HOSTS} hosts")
        numbers += [str(n).zfill(len(first)) for n in range(int(first), int(last) + 1)]
    return numbers


def _bad(text: str, why: str) -> UsageError:
    return UsageError(f"Slurm host list {text!r}: {why}")
