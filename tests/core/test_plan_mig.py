"""MIG instances are the units a CUDA job gets: one per worker, with its own memory budget.

Each test re-derives what the child's CUDA runtime would enumerate from the child's
environment (the CUDA_VISIBLE_DEVICES model of core.masks) and checks it against the plan.
"""

from __future__ import annotations

import json

import pytest

from helpers import load_inventory
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.core.visibility import parent_visible
from xpulaunch.errors import SelectionError
from xpulaunch.model import Plan, Unit, Vendor

ARGV = ("/usr/bin/python3", "train.py")
HOST = load_inventory("a100-mig.json")
A100, PLAIN = HOST.of(Vendor.NVIDIA)


def plan(parent: dict[str, str] | None = None, **request: object) -> Plan:
    return make_plan(LaunchRequest(argv=ARGV, **request), HOST, parent or {})  # type: ignore[arg-type]


def seen_by_child(plan: Plan, rank: int, parent: dict[str, str]) -> tuple[Unit, ...]:
    child = plan.workers[rank].child_env(parent)
    return parent_visible(HOST, Vendor.NVIDIA, child, hierarchy=None).units


def test_isolated_workers_get_one_mig_instance_each() -> None:
    result = plan(gpus="all", nproc_per_node=None, isolate=True)
    expected = [Unit(A100, mig=m) for m in A100.mig_devices] + [Unit(PLAIN)]
    assert list(result.devices) == expected
    assert len(result.workers) == 3
    for rank, unit in enumerate(expected):
        assert seen_by_child(result, rank, {}) == (unit,)


def test_a_mig_slice_gets_its_own_memory_budget_not_the_cards() -> None:
    result = plan(gpus=A100.mig_devices[1].uuid)
    budget = json.loads(result.workers[0].env["XPULAUNCH_MAX_MEMORY"] or "")
    slice_bytes = A100.mig_devices[1].memory_total_bytes or 0
    assert budget == {"0": pytest.approx(slice_bytes, rel=0.11)}
    assert budget["0"] <= slice_bytes


def test_the_second_mig_uuid_selects_the_second_instance() -> None:
    mig = A100.mig_devices[1]
    result = plan(gpus=mig.uuid)
    assert result.devices == (Unit(A100, mig=mig),)
    assert result.workers[0].env["CUDA_VISIBLE_DEVICES"] == mig.uuid
    assert seen_by_child(result, 0, {}) == (Unit(A100, mig=mig),)


def test_a_mig_uuid_prefix_selects_that_instance() -> None:
    mig = A100.mig_devices[1]
    assert plan(gpus=mig.uuid[:12]).devices == (Unit(A100, mig=mig),)


def test_the_card_id_of_a_mig_gpu_hands_out_its_instances() -> None:
    result = plan(gpus="device=0", nproc_per_node=None, isolate=True)
    assert [u.mig for u in result.devices] == list(A100.mig_devices)


def test_one_process_given_two_instances_is_refused_with_the_fix() -> None:
    with pytest.raises(
        SelectionError, match=r"2 MIG instances.*a CUDA process uses one.*--isolate.*--gpus 1"
    ):
        plan(gpus="device=0")


def test_a_lease_on_one_instance_leaves_the_other_free() -> None:
    first = Unit(A100, mig=A100.mig_devices[0])
    result = make_plan(
        LaunchRequest(argv=ARGV, gpus="2", nproc_per_node=None, isolate=True),
        HOST,
        {},
        unavailable={first.key: "job 7"},
    )
    assert set(result.devices) == {Unit(A100, mig=A100.mig_devices[1]), Unit(PLAIN)}
    assert first.key.startswith(A100.key + "/MIG-")


def test_the_plan_document_names_each_mig_instance() -> None:
    from xpulaunch.core.plan import to_dict

    doc = to_dict(plan(gpus="all", nproc_per_node=None, isolate=True))
    assert [d.get("mig_uuid") for d in doc["devices"]] == [
        *(m.uuid for m in A100.mig_devices),
        None,
    ]


def test_a_mig_instance_and_a_whole_gpu_in_one_process_is_refused_with_the_fix() -> None:
    # `--gpus 2` picks the plain GPU and one instance; CUDA would enumerate the instance alone.
    with pytest.raises(
        SelectionError,
        match=r"a MIG instance and 1 other device.*no other GPU.*--isolate.*--gpus MIG-",
    ):
        plan(gpus="2")


def test_cuda_enumerates_a_mig_instance_alone_when_listed_with_a_whole_gpu() -> None:
    mig = A100.mig_devices[1]
    child = {"CUDA_VISIBLE_DEVICES": f"{PLAIN.uuid},{mig.uuid}"}
    seen = parent_visible(HOST, Vendor.NVIDIA, child, hierarchy=None)
    assert seen.units == (Unit(A100, mig=mig),)
    assert any("enumerates that instance alone" in n for n in seen.notes)


@pytest.mark.parametrize("gpus", ["2", "all", "auto", "device=0", "device=1", "MIG-8a7b,1", "1"])
@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.parametrize("nproc", [1, None])
def test_every_plan_on_a_mig_host_gives_each_child_what_its_cuda_enumerates(
    gpus: str, isolate: bool, nproc: int | None
) -> None:
    try:
        result = plan(gpus=gpus, isolate=isolate, nproc_per_node=nproc)
    except SelectionError:
        return  # refused in one line: nothing is started
    for worker in result.workers:
        claimed = tuple(result.devices[i] for i in worker.units)
        assert seen_by_child(result, worker.local_rank, {}) == claimed
