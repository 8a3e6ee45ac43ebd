"""Several small jobs on one device: the room rule, and what a sharing job's plan says."""

from __future__ import annotations

import json

import pytest

from helpers import load_inventory
from xpulaunch.core.plan import LaunchRequest, make_plan, to_dict
from xpulaunch.core.slots import SlotHolder, room_for, unit_rejection
from xpulaunch.errors import SelectionError
from xpulaunch.model import Device, DeviceShare, Unit, Vendor

GiB = 1 << 30
TOTAL = 80 * GiB


def holders(*shares: DeviceShare) -> list[SlotHolder]:
    return [SlotHolder(share, f"pid {i}") for i, share in enumerate(shares, 1)]


@pytest.mark.parametrize(
    ("share", "others", "fits"),
    [
        (DeviceShare(slots=2), (), True),
        (DeviceShare(slots=2), (DeviceShare(slots=2),), True),
        (DeviceShare(slots=2), (DeviceShare(slots=2), DeviceShare(slots=2)), False),
        # The smallest K on the device wins, the newcomer's or a holder's.
        (DeviceShare(slots=4), (DeviceShare(slots=2), DeviceShare(slots=2)), False),
        (DeviceShare(slots=2), (DeviceShare(slots=4), DeviceShare(slots=4)), False),
        (DeviceShare(memory_bytes=40 * GiB), (DeviceShare(memory_bytes=40 * GiB),), True),
        (DeviceShare(memory_bytes=41 * GiB), (DeviceShare(memory_bytes=40 * GiB),), False),
        # A slot job claims total / K against budgets.
        (DeviceShare(memory_bytes=50 * GiB), (DeviceShare(slots=2),), False),
        (DeviceShare(memory_bytes=40 * GiB), (DeviceShare(slots=2),), True),
        (None, (), True),
        (None, (DeviceShare(slots=8),), False),  # a whole-device job never joins slot jobs
    ],
)
def test_room_for(share: DeviceShare | None, others: tuple[DeviceShare, ...], fits: bool) -> None:
    assert (room_for(share, holders(*others), TOTAL) is None) is fits


def test_room_for_says_who_fills_the_device() -> None:
    why = room_for(DeviceShare(slots=2), holders(DeviceShare(slots=2), DeviceShare(slots=2)), TOTAL)
    assert why == "2 jobs sharing it, all 2 slots taken (pid 1; pid 2)"


def test_budgets_need_the_device_memory() -> None:
    why = room_for(DeviceShare(memory_bytes=GiB), holders(DeviceShare(memory_bytes=GiB)), None)
    assert why is not None and "memory is unknown" in why


def unit(total: int | None = TOTAL, used: int | None = 0) -> Unit:
    return Unit(Device(Vendor.NVIDIA, 0, memory_total_bytes=total, memory_used_bytes=used))


def test_a_sharing_job_checks_its_share_against_free_memory_not_busy() -> None:
    busy = unit(used=30 * GiB)  # "busy" (over 10% used) for a whole-device job
    assert unit_rejection(busy, DeviceShare(slots=2)) is None  # 50 GiB free >= 40 GiB share
    assert unit_rejection(unit(used=50 * GiB), DeviceShare(slots=2)) == (
        "30.0 GiB free < this job's share of 40.0 GiB"
    )
    assert unit_rejection(unit(), DeviceShare(memory_bytes=100 * GiB)) == (
        "--gpu-memory 100.0 GiB > its 80.0 GiB"
    )
    assert unit_rejection(unit(total=None, used=None), DeviceShare(slots=2)) is None


def test_plan_of_a_sharing_job_carries_its_share() -> None:
    inventory = load_inventory("2x-h200.json")
    request = LaunchRequest(argv=("python", "x.py"), gpus="1", share=DeviceShare(slots=2))
    plan = make_plan(request, inventory, {})
    total = inventory.devices[0].memory_total_bytes
    assert total is not None
    env = plan.workers[0].env
    assert json.loads(str(env["XPULAUNCH_MAX_MEMORY"])) == {"0": total // 2}
    doc = to_dict(plan)
    assert doc["share"] == {
        "slots_per_gpu": 2,
        "gpu_memory_bytes": None,
        "device_bytes": [total // 2],
    }
    assert any(
        n.startswith("sharing: one slot of each device (--slots-per-gpu 2)") for n in plan.notes
    )
    budget = make_plan(
        LaunchRequest(argv=("x",), gpus="1", share=DeviceShare(memory_bytes=10 * GiB)),
        inventory,
        {},
    )
    assert json.loads(str(budget.workers[0].env["XPULAUNCH_MAX_MEMORY"])) == {"0": 10 * GiB}


def test_a_plan_without_share_is_unchanged() -> None:
    plan = make_plan(LaunchRequest(argv=("x",), gpus="1"), load_inventory("2x-h200.json"), {})
    assert plan.share is None and to_dict(plan)["share"] is None


def test_a_budget_larger_than_every_device_cannot_be_met() -> None:
    request = LaunchRequest(argv=("x",), gpus="1", share=DeviceShare(memory_bytes=1 << 50))
    with pytest.raises(SelectionError, match=r"--gpu-memory 1024\.0 TiB > its"):
        make_plan(request, load_inventory("2x-h200.json"), {})
