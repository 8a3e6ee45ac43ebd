"""Slurm host lists expanded as ``scontrol show hostnames`` does."""

from __future__ import annotations

import pytest

from xpulaunch.errors import UsageError
from xpulaunch.nodes.hostlist import expand_hostlist


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node01", ["node01"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("gpu-a[1-2],gpu-b3", ["gpu-a1", "gpu-a2", "gpu-b3"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),  # padding kept past a carry
        ("n[098-100]", ["n098", "n099", "n100"]),
        ("n[9-10]", ["n9", "n10"]),  # no padding: none on the first number
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),  # last group varies fastest
        ("a,b[3],c", ["a", "b3", "c"]),
        ("x[5]-ib", ["x5-ib"]),
        (" node[1,3] ", ["node1", "node3"]),
    ],
)
def test_expansions(text: str, hosts: list[str]) -> None:
    assert list(expand_hostlist(text)) == hosts


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("node[1-", "unbalanced '['"),
        ("node1]", "unbalanced ']'"),
        ("node[a-b]", "not a number"),
        ("node[4-2]", "runs backwards"),
        ("a,,b", "empty host name"),
        ("n[0-99999999]", "more than 65536 hosts"),
    ],
)
def test_bad_lists_name_the_problem(text: str, why: str) -> None:
    with pytest.raises(UsageError, match="Slurm host list") as caught:
        expand_hostlist(text)
    assert why in str(caught.value)
