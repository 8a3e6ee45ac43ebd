"""make_plan: the whole answer for each host in tests/fixtures/inventories."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from helpers import inventory_names, load_inventory
from xpulaunch.core import plan as plan_doc
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.core.visibility import parent_visible
from xpulaunch.errors import DeviceBusyError, SelectionError, XpulaunchError
from xpulaunch.model import Backend, DeviceMap, Hierarchy, Plan, Vendor

H200 = ("GPU-a6026e70-2f8a-387f-486f-d49cebe1fb04", "GPU-e436550d-4102-c58c-de2e-988dc6aaa541")
ARGV = ("/usr/bin/python3", "train.py")


def plan_for(
    name: str,
    parent_env: Mapping[str, str] | None = None,
    unavailable: Mapping[str, str] | None = None,
    **request: object,
) -> Plan:
    req = LaunchRequest(argv=ARGV, master_port=29555, **request)  # type: ignore[arg-type]
    return make_plan(req, load_inventory(name), parent_env or {}, unavailable=unavailable)


def test_cpu_only_host_plans_a_cpu_run_and_says_why() -> None:
    plan = plan_for("cpu-only.json")
    assert plan.backend is Backend.CPU and plan.devices == () and plan.device_map is None
    assert any("running on the CPU" in n for n in plan.notes)
    (worker,) = plan.workers
    assert worker.env["RANK"] == "0" and worker.env["WORLD_SIZE"] == "1"
    assert worker.env["MASTER_PORT"] == "29555"
    assert "CUDA_VISIBLE_DEVICES" not in worker.env


def test_two_h200_job_wide_ddp() -> None:
    plan = plan_for("2x-h200.json", gpus="2", nproc_per_node=None)
    assert plan.backend is Backend.CUDA and plan.device_map is DeviceMap.SEQUENTIAL
    assert [w.env["RANK"] for w in plan.workers] == ["0", "1"]
    for worker in plan.workers:
        assert worker.env["CUDA_VISIBLE_DEVICES"] == ",".join(H200)
        assert worker.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert worker.env["LOCAL_WORLD_SIZE"] == "2"
        assert worker.env["OMP_NUM_THREADS"] == "1"
        # each rank's own device (the one its LOCAL_RANK picks), not the whole job's map
        assert worker.env["XPULAUNCH_DEVICE_MAP"] == "sequential"
        assert set(json.loads(worker.env["XPULAUNCH_MAX_MEMORY"] or "")) == {
            worker.env["LOCAL_RANK"]
        }
    assert plan.workers[1].local_rank == 1


def test_isolate_gives_each_worker_its_own_gpu_and_keeps_local_rank() -> None:
    plan = plan_for("2x-h200.json", gpus="2", nproc_per_node=2, isolate=True)
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in plan.workers] == list(H200)
    assert [w.env["LOCAL_RANK"] for w in plan.workers] == ["0", "1"]
    assert all(w.env["XPULAUNCH_DEVICE_MAP"] == "sequential" for w in plan.workers)


def test_parent_mask_restricts_what_may_be_handed_out() -> None:
    plan = plan_for("2x-h200.json", {"CUDA_VISIBLE_DEVICES": "1"}, gpus="auto")
    assert [u.device.index for u in plan.devices] == [1]
    assert plan.workers[0].env["CUDA_VISIBLE_DEVICES"] == H200[1]
    with pytest.raises(SelectionError, match="hidden"):
        plan_for("2x-h200.json", {"CUDA_VISIBLE_DEVICES": "1"}, gpus="0,1")


def test_parent_hiding_every_nvidia_gpu_means_cpu() -> None:
    plan = plan_for("2x-h200.json", {"CUDA_VISIBLE_DEVICES": ""})
    assert plan.backend is Backend.CPU


def test_env_is_a_diff_against_the_parent() -> None:
    parent = {"CUDA_VISIBLE_DEVICES": H200[0], "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "RANK": "0"}
    plan = plan_for("2x-h200.json", parent, gpus="1")
    env = plan.workers[0].env
    assert "CUDA_VISIBLE_DEVICES" not in env and "CUDA_DEVICE_ORDER" not in env
    assert "RANK" not in env
    assert env["WORLD_SIZE"] == "1"


def test_leased_gpu_is_skipped_and_explicit_request_refused() -> None:
    held = {"0000:00:06.0": "pid 7 (python a.py, user ann, since 10:00)"}
    plan = plan_for("2x-h200.json", unavailable=held, gpus="1")
    assert [u.device.index for u in plan.devices] == [1]
    with pytest.raises(DeviceBusyError, match="pid 7"):
        plan_for("2x-h200.json", unavailable=held, gpus="0,1")
    every = {"0000:00:06.0": "a", "0000:00:07.0": "b"}
    with pytest.raises(SelectionError, match="no free device"):
        plan_for("2x-h200.json", unavailable=every)


def test_busy_gpu_skipped_by_count() -> None:
    plan = plan_for("8x-h100.json", gpus="4")
    assert 3 not in [u.device.index for u in plan.devices]


def test_max1550_flat_default_hands_out_tiles_with_flat_masks() -> None:
    plan = plan_for("2x-max1550.json", gpus="device=1", nproc_per_node=None, isolate=True)
    assert plan.backend is Backend.XPU and plan.hierarchy is Hierarchy.FLAT
    assert [(u.device.index, u.tile) for u in plan.devices] == [(1, 0), (1, 1)]
    masks = [w.env["ZE_AFFINITY_MASK"] for w in plan.workers]
    assert masks == ["2", "3"]  # flat index = tiles of the cards before it + tile
    for worker in plan.workers:
        assert worker.env["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT"
        assert "level_zero" in (worker.env["ONEAPI_DEVICE_SELECTOR"] or "")


def test_max1550_composite_hands_out_cards() -> None:
    plan = plan_for("2x-max1550.json", {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, gpus="1")
    assert [(u.device.index, u.tile) for u in plan.devices] == [(0, None)]
    assert plan.workers[0].env["ZE_AFFINITY_MASK"] == "0"
    assert "ZE_FLAT_DEVICE_HIERARCHY" not in plan.workers[0].env  # same as the parent's


def test_arc_with_igpu_auto_uses_the_dgpu_only() -> None:
    plan = plan_for("arc-b580-igpu.json")
    assert [u.device.name for u in plan.devices] == ["Intel(R) Arc(TM) B580 Graphics"]
    assert plan.workers[0].env["ZE_AFFINITY_MASK"] == "0"


def test_hybrid_host_nvidia_child_and_intel_child() -> None:
    cuda = plan_for("hybrid-4090-arc.json")
    assert cuda.backend is Backend.CUDA
    assert any("NVIDIA and Intel GPUs are visible" in n for n in cuda.notes)
    xpu = plan_for("hybrid-4090-arc.json", backend="xpu")
    env = xpu.workers[0].env
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # hides every NVIDIA GPU from the Intel child
    assert env["ZE_AFFINITY_MASK"] == "0"


def test_intel_child_drops_obsolete_sycl_filter() -> None:
    plan = plan_for("arc-b580-igpu.json", {"SYCL_DEVICE_FILTER": "level_zero:gpu:1"})
    assert plan.workers[0].env["SYCL_DEVICE_FILTER"] is None


def test_amd_children_use_rocr_and_drop_hip() -> None:
    plan = plan_for("4x-mi300x.json", {"HIP_VISIBLE_DEVICES": "0,1,2,3"}, gpus="2")
    env = plan.workers[0].env
    assert plan.backend is Backend.ROCM
    assert env["ROCR_VISIBLE_DEVICES"]
    assert env["HIP_VISIBLE_DEVICES"] is None


def test_balanced_low_0_on_request() -> None:
    plan = plan_for("2x-h200.json", gpus="2", device_map=DeviceMap.BALANCED_LOW_0)
    assert plan.device_map is DeviceMap.BALANCED_LOW_0
    assert plan.workers[0].env["XPULAUNCH_DEVICE_MAP"] == "balanced_low_0"


@pytest.mark.parametrize("name", inventory_names())
@pytest.mark.parametrize("isolate", [False, True])
def test_every_host_plans_and_serialises(name: str, isolate: bool) -> None:
    try:
        plan = plan_for(name, nproc_per_node=None, isolate=isolate)
    except XpulaunchError as exc:  # e.g. --isolate on a host whose devices are all busy
        assert "\n" not in str(exc)
        return
    doc = json.loads(json.dumps(plan_doc.to_dict(plan)))
    assert doc["schema"] == "xpulaunch.plan/1"
    assert len(doc["workers"]) == max(len(plan.devices), 1)
    assert doc["notes"], "every plan explains itself"
    for worker in doc["workers"]:
        assert worker["argv"] == list(ARGV)
        assert worker["env"]["RANK"] == str(worker["rank"])
    assert doc["set_at_start"] == [
        "XPULAUNCH_JOB_ID", "XPULAUNCH_WORKER", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_ERROR_FILE", "XPULAUNCH_HEARTBEAT_FILE",
    ]  # fmt: skip


@pytest.mark.parametrize(("max_restarts", "value"), [(0, "0"), (3, "3"), (None, "-1")])
def test_the_plan_holds_the_restart_limit_as_torchelastic_writes_it(
    max_restarts: int | None, value: str
) -> None:
    plan = plan_for("2x-h200.json", gpus="2", nproc_per_node=2, max_restarts=max_restarts)
    assert [w.env["TORCHELASTIC_MAX_RESTARTS"] for w in plan.workers] == [value, value]


def test_without_restarts_the_plan_says_so_by_default() -> None:
    (worker,) = plan_for("cpu-only.json").workers
    assert worker.env["TORCHELASTIC_MAX_RESTARTS"] == "0"


def test_non_distributed_workers_get_no_rank_variables_and_no_omp_default() -> None:
    plan = plan_for("2x-h200.json", gpus="2", nproc_per_node=2, isolate=True, distributed=False)
    for worker in plan.workers:
        assert not {
            "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "OMP_NUM_THREADS",
            "TORCHELASTIC_MAX_RESTARTS",
        } & set(worker.env)  # fmt: skip
        assert worker.env["CUDA_VISIBLE_DEVICES"] in H200
    assert not any(n.startswith("OMP_NUM_THREADS") for n in plan.notes)


@pytest.mark.parametrize(
    "parent", [{}, {"ROCR_VISIBLE_DEVICES": "0,1"}, {"HIP_VISIBLE_DEVICES": ""}]
)
def test_amd_plans_of_unpartitioned_gpus_carry_no_partition_note(parent: dict[str, str]) -> None:
    plan = plan_for("4x-mi300x.json", parent, gpus="2")
    assert not [n for n in plan.notes if "partition" in n], plan.notes


@pytest.mark.parametrize(
    ("request_args", "chosen"),
    [
        # several workers, each on the device LOCAL_RANK picks: the best N of the free ones
        ({"nproc_per_node": 2}, ["nvidia:0", "nvidia:1"]),
        ({"nproc_per_node": 3, "gpus": "auto"}, ["nvidia:0", "nvidia:1", "nvidia:2"]),
        # one process may spread a model over every device; --isolate gives each worker a
        # share of them; auto workers are one per device; a count is taken as it is
        ({"nproc_per_node": 1}, ["nvidia:0", "nvidia:1", "nvidia:2", "nvidia:4", "nvidia:5",
                                 "nvidia:6", "nvidia:7"]),
        ({"nproc_per_node": 2, "isolate": True}, ["nvidia:0", "nvidia:1", "nvidia:2", "nvidia:4",
                                                  "nvidia:5", "nvidia:6", "nvidia:7"]),
        ({"nproc_per_node": None}, ["nvidia:0", "nvidia:1", "nvidia:2", "nvidia:4", "nvidia:5",
                                    "nvidia:6", "nvidia:7"]),
        ({"nproc_per_node": 2, "gpus": "4"}, ["nvidia:0", "nvidia:1", "nvidia:2", "nvidia:4"]),
    ],
)  # fmt: skip
def test_auto_for_workers_that_use_one_device_each_leaves_the_rest(
    request_args: dict[str, object], chosen: list[str]
) -> None:
    plan = plan_for("8x-h100.json", **request_args)  # nvidia 3 is busy: 7 free
    assert [f"{d.device.vendor.value}:{d.device.index}" for d in plan.devices] == chosen
    left = [n for n in plan.notes if "left to other jobs" in n]
    if len(chosen) < 7 and request_args.get("gpus", "auto") == "auto":
        assert len(left) == 1
        assert left[0].endswith(
            f": free, left to other jobs: {len(chosen)} workers use one device each "
            "(--nproc-per-node auto: one worker per free device)"
        )
        assert "nvidia 7" in left[0] and "nvidia 3" not in left[0]
    else:
        assert left == []


def test_auto_for_more_workers_than_free_devices_takes_every_free_one() -> None:
    plan = plan_for("2x-h200.json", nproc_per_node=4)
    assert len(plan.devices) == 2 and len(plan.workers) == 4
    assert not any("left to other jobs" in n for n in plan.notes)


@pytest.mark.parametrize(
    ("name", "parent", "gpus", "isolate"),
    [
        ("arc-b580-igpu.json", {}, "device=1,0", False),  # iGPU named first
        ("arc-b580-igpu.json", {"ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}, "device=0,1", False),
        ("2x-max1550.json", {}, "device=1.1,0.0", False),
        ("2x-max1550.json", {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, "device=1,0", False),
        ("2x-max1550.json", {}, "device=1.1,1.0,0.1,0.0", True),  # two tiles per worker
    ],
)
def test_intel_devices_are_planned_in_the_order_the_child_enumerates_them(
    name: str, parent: dict[str, str], gpus: str, isolate: bool
) -> None:
    # ZE_AFFINITY_MASK ignores the order of its entries: the child's xpu:0 is the first of its
    # devices in driver order, so that is the device LOCAL_RANK 0 uses and the plan lists first.
    plan = plan_for(name, parent, gpus=gpus, nproc_per_node=2, isolate=isolate)
    inventory = load_inventory(name)
    for worker in plan.workers:
        child = worker.child_env(parent)
        seen = parent_visible(inventory, Vendor.INTEL, child, hierarchy=None).units
        assert seen == tuple(plan.devices[i] for i in worker.units)
        assert child["XPULAUNCH_DEVICES"] == ",".join(u.key for u in seen)
    assert any("driver order" in n for n in plan.notes)
