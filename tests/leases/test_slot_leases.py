"""Slot leases (--slots-per-gpu, --gpu-memory) with real flocks: a shared lock on the unit
and one slot lock per job, seen by whole-device launches as a lease like any other."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from helpers import load_inventory
from xpulaunch import api
from xpulaunch.errors import DeviceBusyError, SelectionError
from xpulaunch.leases import Lease, LeaseManager
from xpulaunch.model import DeviceShare, Inventory, Plan

INVENTORY = load_inventory("2x-h200.json")
DEV0, DEV1 = (d.key for d in INVENTORY.devices)
TOTAL = INVENTORY.devices[0].memory_total_bytes or 0
GiB = 1 << 30


def planner(gpus: str, share: DeviceShare | None, inventory: Inventory = INVENTORY
            ) -> Callable[[Mapping[str, str]], Plan]:  # fmt: skip
    def plan(unavailable: Mapping[str, str]) -> Plan:
        return api.plan(
            ["job.py"], gpus=gpus, inventory=inventory, parent_env={}, share=share,
            unavailable=unavailable, must_exist=False, master_port=29500,
        )  # fmt: skip

    return plan


@pytest.fixture
def manager(tmp_path: Path) -> LeaseManager:
    return LeaseManager(tmp_path / "locks")


def take(
    manager: LeaseManager, gpus: str = "1", share: DeviceShare | None = None
) -> tuple[Plan, Lease]:
    return manager.allocate(planner(gpus, share), share=share, command=["job.py"])


def devices(plan: Plan) -> list[str]:
    return [u.key for u in plan.devices]


def test_k_jobs_share_a_device_and_the_next_goes_elsewhere(manager: LeaseManager) -> None:
    two = DeviceShare(slots=2)
    leases = [take(manager, share=two) for _ in range(4)]
    assert [devices(plan) for plan, _ in leases] == [[DEV0], [DEV0], [DEV1], [DEV1]]
    assert all(len(lease.fds) == 2 for _, lease in leases)  # the unit's shared lock, a slot
    with pytest.raises(SelectionError) as full:
        take(manager, share=two)
    assert "leased by 2 jobs sharing it, all 2 slots taken (pid" in full.value.cli_message()
    report = manager.status()
    assert report.leases == ()
    assert [(s.key, s.slot, s.share.slots) for s in report.slots] == [
        (DEV0, 0, 2), (DEV0, 1, 2), (DEV1, 0, 2), (DEV1, 1, 2),
    ]  # fmt: skip
    assert {s.holder.pid for s in report.slots if s.holder} == {os.getpid()}
    leases[1][1].release()  # the job ends: its slot is free again
    plan, _ = take(manager, share=two)
    assert devices(plan) == [DEV0]
    for _, lease in leases:
        lease.release()


def test_whole_device_and_sharing_jobs_keep_each_other_out(manager: LeaseManager) -> None:
    _, alone = take(manager, gpus=f"device={DEV0}")
    plan, shared = take(manager, share=DeviceShare(slots=4))
    assert devices(plan) == [DEV1]  # the device leased whole is not shared
    with pytest.raises(DeviceBusyError, match="1 job sharing it"):
        take(manager, gpus=f"device={DEV1}")
    with pytest.raises(SelectionError, match="1 job sharing it"):
        take(manager, gpus="2")
    alone.release()
    shared.release()
    plan, _ = take(manager, gpus="2")
    assert devices(plan) == [DEV0, DEV1]


def test_the_smallest_k_on_a_device_wins(manager: LeaseManager) -> None:
    take(manager, gpus=f"device={DEV0}", share=DeviceShare(slots=2))
    take(manager, gpus=f"device={DEV0}", share=DeviceShare(slots=2))
    with pytest.raises(DeviceBusyError, match="all 2 slots taken"):
        take(manager, gpus=f"device={DEV0}", share=DeviceShare(slots=4))


def test_memory_budgets_fill_a_device(manager: LeaseManager) -> None:
    big = DeviceShare(memory_bytes=TOTAL // 2)
    first, _ = take(manager, share=big)
    second, _ = take(manager, share=big)
    assert devices(first) == devices(second) == [DEV0]
    assert json.loads(str(first.workers[0].env["XPULAUNCH_MAX_MEMORY"])) == {"0": TOTAL // 2}
    third, _ = take(manager, share=DeviceShare(memory_bytes=GiB))
    assert devices(third) == [DEV1]  # nvidia 0 has no byte left
    with pytest.raises(DeviceBusyError, match=r"promised, no room for 1\.0 GiB more"):
        take(manager, gpus=f"device={DEV0}", share=DeviceShare(memory_bytes=GiB))
    with pytest.raises(DeviceBusyError, match=r"1\.0 GiB of its 140\.4 GiB promised"):
        take(manager, gpus=f"device={DEV1}", share=DeviceShare(memory_bytes=TOTAL))


def test_a_stale_whole_device_holder_file_does_not_name_the_sharers(
    manager: LeaseManager,
) -> None:
    _, alone = take(manager, gpus=f"device={DEV0}")
    alone.release()  # its holder file stays behind, with its lock free
    _, shared = take(manager, gpus=f"device={DEV0}", share=DeviceShare(slots=2))
    report = manager.status()
    assert report.leases == ()  # not the old whole-device holder
    assert [s.key for s in report.slots] == [DEV0]
    assert manager.unavailable()[DEV0].startswith("1 job sharing it (pid ")
    assert DEV0 not in manager.unavailable(DeviceShare(slots=2))
    shared.release()
