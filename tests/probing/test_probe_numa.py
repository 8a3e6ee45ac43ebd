"""The CPU layout the probe records for --cpu-bind (probing.numa, probing.parsers.numa)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from xpulaunch.core.cpu_bind import parse_cpulist
from xpulaunch.probing.numa import read_cpu_topology
from xpulaunch.probing.parsers.common import ParseError
from xpulaunch.probing.parsers.numa import (
    parse_allowed_cpus,
    parse_cpus,
    parse_numa_node,
    sibling_groups,
)
from xpulaunch.probing.sysfs import list_pci_gpus

MACHINES = Path(__file__).parents[1] / "fixtures" / "sysfs"
INTEL = MACHINES / "intel-8x-max1550-2socket"


def test_numa_node_minus_one_is_unknown() -> None:
    assert parse_numa_node("1\n") == 1
    assert parse_numa_node("-1\n") is None
    with pytest.raises(ParseError, match="not a node number"):
        parse_numa_node("x")


def test_cpu_lists_are_recorded_canonically() -> None:
    assert parse_cpus("0-3,8-11\n") == "0-3,8-11"
    assert parse_cpus("3,1,2") == "1-3"
    assert parse_allowed_cpus("Name:\tx\nCpus_allowed:\tff\nCpus_allowed_list:\t0-7\n") == "0-7"
    assert parse_allowed_cpus("Name:\tx\n") is None
    assert sibling_groups({0: "0,16", 16: "0,16", 1: "1,17"}) == ["0,16", "1,17"]


def test_a_memory_only_node_has_no_cpus_to_bind_to() -> None:
    topology, problems = read_cpu_topology(str(INTEL / "sys"), str(INTEL / "proc"))
    assert problems == []
    assert topology is not None and set(topology["numa_nodes"]) == {"0", "1"}  # type: ignore[arg-type]


def test_each_core_is_read_once(tmp_path: Path) -> None:
    root = tmp_path / "m"
    shutil.copytree(INTEL, root, symlinks=True)
    (root / "sys/devices/system/cpu/cpu16/topology/thread_siblings_list").unlink()
    topology, problems = read_cpu_topology(str(root / "sys"), str(root / "proc"))
    assert problems == []  # cpu16's siblings were known from cpu0's file
    assert topology is not None and "0,16" in topology["smt_siblings"]  # type: ignore[operator]


def test_a_kernel_without_numa_has_one_node_of_the_online_cpus(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-3\n")
    topology, problems = read_cpu_topology(str(tmp_path / "sys"), str(tmp_path / "proc"))
    assert topology == {"numa_nodes": {"0": "0-3"}, "smt_siblings": [], "cpus_allowed": None}
    assert problems == []


def test_no_cpu_information_at_all_records_nothing(tmp_path: Path) -> None:
    assert read_cpu_topology(str(tmp_path), str(tmp_path)) == (None, [])


def test_a_garbled_device_numa_node_is_a_problem_not_a_guess(tmp_path: Path) -> None:
    root = tmp_path / "m"
    shutil.copytree(INTEL, root, symlinks=True)
    (root / "sys/bus/pci/devices/0000:18:00.0/numa_node").write_text("zero\n")
    gpus, problems = list_pci_gpus(root / "sys")
    assert gpus is not None
    assert "numa_node" not in gpus[0].facts() and gpus[0].facts()["local_cpulist"] == "0-7,16-23"
    assert any("numa_node" in p.message for p in problems)
    assert gpus[1].facts()["numa_node"] == 0


def test_the_probe_of_this_machine_records_its_real_layout() -> None:
    topology, _ = read_cpu_topology("/sys", "/proc")
    assert topology is not None
    nodes: dict[str, str] = topology["numa_nodes"]  # type: ignore[assignment]
    every = frozenset().union(*(parse_cpulist(cpus) for cpus in nodes.values()))
    assert os.sched_getaffinity(0) <= every
    assert parse_cpulist(str(topology["cpus_allowed"])) == os.sched_getaffinity(0)


def test_the_probe_writes_the_key_the_planner_reads() -> None:
    from xpulaunch.core import cpu_bind
    from xpulaunch.probing import numa

    assert numa.TOPOLOGY_KEY == cpu_bind.TOPOLOGY_KEY
