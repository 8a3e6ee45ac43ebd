"""--cpu-bind decisions (core.cpu_bind), table tests on hand-built topologies."""

from __future__ import annotations

import pytest

from xpulaunch.core.cpu_bind import (
    CpuBind,
    CpuTopology,
    bind_workers,
    device_cpus,
    format_cpulist,
    from_torchrun,
    parse_cpu_bind,
    parse_cpulist,
    topology_of,
)
from xpulaunch.errors import InventoryError, SelectionError, UsageError
from xpulaunch.model import Device, Inventory, Unit, Vendor

# 2 sockets x 4 cores x 2 threads: node 0 = 0-3,8-11, node 1 = 4-7,12-15 (siblings N, N+8).
TWO_NODES = CpuTopology(
    nodes={0: parse_cpulist("0-3,8-11"), 1: parse_cpulist("4-7,12-15")},
    cores=tuple(frozenset({c, c + 8}) for c in range(8)),
)


def gpu(index: int, node: int | None, local: str | None = None) -> Device:
    extra: dict[str, object] = {"numa_node": node}
    if local is not None:
        extra["local_cpulist"] = local
    return Device(Vendor.NVIDIA, index, "G", f"0000:{index + 16:02x}:00.0", extra=extra)


def cpus(binding: object) -> str:
    return format_cpulist(getattr(binding, "cpus", ()))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0-2,4", {0, 1, 2, 4}), ("", set()), (" 7 \n", {7}), ("0-0,1", {0, 1})],
)
def test_cpulists_read_as_the_kernel_writes_them(text: str, expected: set[int]) -> None:
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "-1", "0-99999999"])
def test_malformed_cpulists_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a CPU number"):
        parse_cpulist(text)


def test_cpulists_are_written_with_ranges() -> None:
    assert format_cpulist({0, 1, 2, 4, 8, 9}) == "0-2,4,8-9"
    assert format_cpulist([]) == ""


def test_numa_binds_each_rank_to_its_devices_node() -> None:
    used = [[Unit(gpu(0, 0))], [Unit(gpu(1, 1))]]
    bindings, notes = bind_workers(CpuBind.NUMA, used, TWO_NODES)
    assert [cpus(b) for b in bindings] == ["0-3,8-11", "4-7,12-15"]
    assert [b.threads for b in bindings if b] == [4, 4]
    assert "rank 1 on CPUs 4-7,12-15 (4 cores, NUMA node 1 of nvidia 1" in notes[1]


def test_numa_ranks_sharing_a_node_share_its_cores_among_their_threads() -> None:
    used = [[Unit(gpu(i, 0))] for i in range(3)]
    bindings, _ = bind_workers(CpuBind.NUMA, used, TWO_NODES)
    assert {cpus(b) for b in bindings} == {"0-3,8-11"}
    assert [b.threads for b in bindings if b] == [1, 1, 1]  # 4 cores // 3 ranks


def test_exclusive_splits_a_nodes_cores_with_siblings_together_first_ranks_one_more() -> None:
    used = [[Unit(gpu(i, 0))] for i in range(3)] + [[Unit(gpu(3, 1))]]
    bindings, _ = bind_workers(CpuBind.EXCLUSIVE, used, TWO_NODES)
    assert [cpus(b) for b in bindings] == ["0-1,8-9", "2,10", "3,11", "4-7,12-15"]
    assert [b.threads for b in bindings if b] == [2, 1, 1, 4]


def test_exclusive_with_more_ranks_than_cores_is_refused() -> None:
    used = [[Unit(gpu(i, 0))] for i in range(5)]
    with pytest.raises(SelectionError, match=r"5 ranks share 4 physical core.*use numa"):
        bind_workers(CpuBind.EXCLUSIVE, used, TWO_NODES)


def test_only_allowed_cpus_are_used() -> None:
    narrowed = CpuTopology(TWO_NODES.nodes, TWO_NODES.cores, parse_cpulist("0-1,8-9"))
    bindings, _ = bind_workers(CpuBind.EXCLUSIVE, [[Unit(gpu(0, 0))]] * 2, narrowed)
    assert [cpus(b) for b in bindings] == ["0,8", "1,9"]


def test_an_unknown_node_falls_back_to_local_cpulist() -> None:
    device = gpu(0, None, local="4-7,12-15")
    assert device_cpus(device, TWO_NODES) == (parse_cpulist("4-7,12-15"), 1)


def test_an_unknown_node_on_a_two_node_host_leaves_the_rank_unbound_with_a_warning() -> None:
    used = [[Unit(gpu(0, None, local="0-15"))], [Unit(gpu(1, 1))]]
    bindings, notes = bind_workers(CpuBind.NUMA, used, TWO_NODES)
    assert bindings[0] is None and cpus(bindings[1]) == "4-7,12-15"
    assert notes[0].startswith("warning: --cpu-bind numa: rank 0 is not bound")
    assert "numa_node -1" in notes[0]


def test_a_one_node_host_needs_no_node_from_the_device() -> None:
    one = CpuTopology({0: parse_cpulist("0-3")})
    bindings, _ = bind_workers(CpuBind.EXCLUSIVE, [[Unit(gpu(0, None))]] * 2, one)
    assert [cpus(b) for b in bindings] == ["0-1", "2-3"]  # no SMT known: a CPU is a core


def test_a_worker_without_devices_is_not_bound() -> None:
    bindings, notes = bind_workers(CpuBind.NUMA, [[]], TWO_NODES)
    assert bindings == (None,) and "no device" in notes[0]


def test_none_binds_nothing_and_needs_no_topology() -> None:
    assert bind_workers(CpuBind.NONE, [[Unit(gpu(0, 0))]], None) == ((None,), ())


def test_binding_without_a_recorded_topology_is_refused() -> None:
    with pytest.raises(SelectionError, match=r"NUMA layout.*devices --json"):
        bind_workers(CpuBind.NUMA, [[Unit(gpu(0, 0))]], None)


def test_the_inventory_topology_is_read_and_checked() -> None:
    doc = {"numa_nodes": {"0": "0-3", "1": "4-7"}, "smt_siblings": ["0,4"], "cpus_allowed": "0-5"}
    topology = topology_of(Inventory(extra={"cpu_topology": doc}))
    assert topology is not None
    assert topology.node_cpus(1) == {4, 5} and topology.cores == (frozenset({0, 4}),)
    assert topology_of(Inventory()) is None
    bad = {"numa_nodes": {"0": "0-x"}}
    with pytest.raises(InventoryError, match=r"cpu_topology.numa_nodes.0"):
        topology_of(Inventory(extra={"cpu_topology": bad}))


def test_cpu_bind_values() -> None:
    assert parse_cpu_bind(None) is CpuBind.NONE
    assert parse_cpu_bind(" NUMA ") is CpuBind.NUMA
    with pytest.raises(UsageError, match="none, numa or exclusive"):
        parse_cpu_bind("socket")


def test_torchrun_numa_binding_values_map_onto_cpu_bind() -> None:
    from torch.numa.binding import AffinityMode

    mapped = {mode.value: from_torchrun(mode.value) for mode in AffinityMode}
    assert {k: v[0] for k, v in mapped.items()} == {
        "node": CpuBind.NUMA,
        "socket": CpuBind.NUMA,
        "exclusive": CpuBind.EXCLUSIVE,
        "core-complex": CpuBind.EXCLUSIVE,
    }
    assert mapped["node"][1] is None and "SNC" in (mapped["socket"][1] or "")
    with pytest.raises(UsageError, match="node, socket, exclusive, core-complex"):
        from_torchrun("gpu")
