"""--cpu-bind plans on the fixture machines (tests/fixtures/sysfs: 2 sockets, 8 GPUs, for
NVIDIA, Intel and AMD). Each check re-derives from the tree's own files, not from the probe:
which device a child's runtime shows it at its LOCAL_RANK (from the child's environment),
that device's numa_node, that node's cpulist and the SMT siblings."""

from __future__ import annotations

from pathlib import Path

import pytest

from xpulaunch.core.cpu_bind import CpuBind, parse_cpulist
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.core.visibility import parent_visible
from xpulaunch.errors import SelectionError
from xpulaunch.model import Inventory, Plan, Vendor, WorkerPlan
from xpulaunch.probing.host import probe_host

MACHINES = Path(__file__).parents[1] / "fixtures" / "sysfs"
HOSTS = {
    "nvidia-8x-h100-2socket": Vendor.NVIDIA,
    "intel-8x-max1550-2socket": Vendor.INTEL,
    "amd-8x-mi300x-2socket": Vendor.AMD,
}


def probe(name: str) -> Inventory:
    root = MACHINES / name
    return probe_host(sys_root=root / "sys", proc_root=root / "proc", env={"PATH": ""},
                      use_nvml=False, use_pyzes=False)  # fmt: skip


def tree_node_cpus(name: str, node: int) -> frozenset[int]:
    path = MACHINES / name / "sys/devices/system/node" / f"node{node}" / "cpulist"
    return parse_cpulist(path.read_text())


def tree_siblings(name: str, cpu: int) -> frozenset[int]:
    path = MACHINES / name / "sys/devices/system/cpu" / f"cpu{cpu}/topology/thread_siblings_list"
    return parse_cpulist(path.read_text())


def node_of_childs_device(name: str, inv: Inventory, worker: WorkerPlan, plan: Plan) -> int:
    """The numa_node file of the device the child's runtime shows at its LOCAL_RANK."""
    vendor = HOSTS[name]
    seen = parent_visible(inv, vendor, worker.child_env({}), hierarchy=None).units
    device = seen[worker.local_rank % len(seen)].device
    bdf = device.pci_bus_id or ""
    return int((MACHINES / name / "sys/bus/pci/devices" / bdf / "numa_node").read_text())


def plan_for(name: str, mode: str, **request: object) -> tuple[Inventory, Plan]:
    inv = probe(name)
    req = LaunchRequest(
        argv=("x",),
        gpus="all",
        nproc_per_node=None,
        cpu_bind=CpuBind(mode),
        **request,  # type: ignore[arg-type]
    )
    return inv, make_plan(req, inv, {})


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_the_probe_records_each_devices_node_and_the_hosts_layout(name: str) -> None:
    inv = probe(name)
    assert [d.extra["numa_node"] for d in inv.devices] == [0] * 4 + [1] * 4
    assert inv.devices[5].extra["local_cpulist"] == "8-15,24-31"
    topology = inv.extra["cpu_topology"]
    assert topology["numa_nodes"] == {"0": "0-7,16-23", "1": "8-15,24-31"}  # type: ignore[index]
    assert topology["cpus_allowed"] == "0-31"  # type: ignore[index]
    assert len(topology["smt_siblings"]) == 16  # type: ignore[index,arg-type]


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_numa_binds_every_child_to_the_node_of_the_device_it_uses(name: str) -> None:
    inv, plan = plan_for(name, "numa")
    ranks_per_node = len(plan.workers) // 2
    for worker in plan.workers:
        node = node_of_childs_device(name, inv, worker, plan)
        assert parse_cpulist(worker.env["XPULAUNCH_CPUS"] or "") == tree_node_cpus(name, node)
        assert worker.env["OMP_NUM_THREADS"] == str(max(8 // ranks_per_node, 1))
    assert sum("--cpu-bind numa: rank" in n for n in plan.notes) == len(plan.workers)


@pytest.mark.parametrize("name", sorted(HOSTS))
@pytest.mark.parametrize("isolate", [False, True])
def test_exclusive_gives_disjoint_whole_cores_on_the_childs_node(name: str, isolate: bool) -> None:
    inv, plan = plan_for(name, "exclusive", isolate=isolate)
    taken: set[int] = set()
    for worker in plan.workers:
        mine = parse_cpulist(worker.env["XPULAUNCH_CPUS"] or "")
        node = node_of_childs_device(name, inv, worker, plan)
        assert mine and mine <= tree_node_cpus(name, node)
        assert all(tree_siblings(name, cpu) <= mine for cpu in mine)  # siblings together
        assert not mine & taken
        taken |= mine
        cores = {min(tree_siblings(name, cpu)) for cpu in mine}
        assert worker.env["OMP_NUM_THREADS"] == str(len(cores))
    # 8 cores a node: 2 each for 4 GPUs, 1 each for the 8 tiles of 4 Max 1550 cards
    assert len(taken) == 32


def test_omp_num_threads_of_the_parent_is_kept() -> None:
    inv = probe("amd-8x-mi300x-2socket")
    req = LaunchRequest(argv=("x",), gpus="2", nproc_per_node=None, cpu_bind=CpuBind.EXCLUSIVE)
    plan = make_plan(req, inv, {"OMP_NUM_THREADS": "6"})
    assert all("OMP_NUM_THREADS" not in w.env for w in plan.workers)
    assert all(w.env["XPULAUNCH_CPUS"] for w in plan.workers)


def test_none_is_the_default_and_drops_an_inherited_binding() -> None:
    inv = probe("nvidia-8x-h100-2socket")
    plan = make_plan(LaunchRequest(argv=("x",), gpus="2"), inv, {"XPULAUNCH_CPUS": "0-3"})
    assert plan.workers[0].env["XPULAUNCH_CPUS"] is None  # removed
    assert not any("--cpu-bind" in n for n in plan.notes)


def test_exclusive_with_more_ranks_than_cores_is_refused_in_one_line() -> None:
    inv = probe("intel-8x-max1550-2socket")
    req = LaunchRequest(argv=("x",), gpus="device=0", nproc_per_node=17, cpu_bind=CpuBind.EXCLUSIVE)
    with pytest.raises(SelectionError, match=r"17 ranks share 8 physical core"):
        make_plan(req, inv, {})
