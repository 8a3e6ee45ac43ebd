"""Allocation in one process: flock locks of separate opens conflict, so two managers here
behave like two launches. (Real processes and signals are in test_lease_processes.py.)"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from xpulaunch.errors import DeviceBusyError, SelectionError
from xpulaunch.leases import LeaseManager
from xpulaunch.leases.lock_files import holder_file_name, lock_file_name
from xpulaunch.model import Inventory, Plan

PlanFor = Callable[..., Any]  # the plan_for fixture (tests/leases/conftest.py)
KEY0, KEY1 = "0000:01:00.0", "0000:02:00.0"


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_count_request_skips_leased_devices(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor
) -> None:
    first, second = LeaseManager(lock_dir), LeaseManager(lock_dir)
    plan_a, lease_a = first.allocate(plan_for(inventory, "2"))
    _plan_b, lease_b = second.allocate(plan_for(inventory, "2"))
    assert lease_a.keys == plan_a.lease_keys == (KEY0, KEY1)
    assert set(lease_b.keys).isdisjoint(lease_a.keys) and len(lease_b.keys) == 2
    with pytest.raises(SelectionError, match="only 0 free"):
        LeaseManager(lock_dir).allocate(plan_for(inventory, "1"))
    lease_a.release()
    _plan, lease_c = LeaseManager(lock_dir).allocate(plan_for(inventory, "2"))
    assert lease_c.keys == (KEY0, KEY1)
    lease_b.release()
    lease_c.release()


def test_explicit_leased_device_names_the_holder(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor
) -> None:
    before = time.strftime("%H:%M")
    _plan, lease = LeaseManager(lock_dir).allocate(
        plan_for(inventory, f"device={KEY1}"), command=["python", "train.py", "--lr", "3e-4"]
    )
    after = time.strftime("%H:%M")
    with lease, pytest.raises(DeviceBusyError) as info:
        LeaseManager(lock_dir).allocate(plan_for(inventory, f"device={KEY1}"))
    user = pwd.getpwuid(os.getuid()).pw_name
    described = [
        f"{KEY1} is leased by pid {os.getpid()} (python train.py --lr 3e-4, user {user}, "
        f"since {hhmm})"
        for hhmm in {before, after}
    ]
    assert info.value.message in described


def test_unavailable_mapping_describes_each_holder(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor
) -> None:
    seen: list[Mapping[str, str]] = []

    def recording(unavailable: Mapping[str, str]) -> Plan:
        seen.append(dict(unavailable))
        plan: Plan = plan_for(inventory, "1")(unavailable)
        return plan

    _p, lease = LeaseManager(lock_dir).allocate(plan_for(inventory, "1"), command=["a.py"])
    with lease:
        _p2, lease2 = LeaseManager(lock_dir).allocate(recording)
        lease2.release()
    # First planned with nothing leased (outside the lock), then under it with the leases.
    assert [list(s) for s in seen] == [[], [KEY0]]
    assert seen[1][KEY0].startswith(f"pid {os.getpid()} (a.py, user ")


def test_cpu_plan_leases_nothing(lock_dir: Path, inventory: Inventory, plan_for: PlanFor) -> None:
    plan, lease = LeaseManager(lock_dir).allocate(plan_for(inventory, "none"))
    assert plan.devices == () and lease.keys == () and lease.fds == ()
    assert LeaseManager(lock_dir).status().leases == ()


def test_release_is_idempotent_and_frees_the_device(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor
) -> None:
    before = _open_fds()
    with LeaseManager(lock_dir).allocate(plan_for(inventory, "4"))[1] as lease:
        assert len(lease.fds) == 4
        assert not any(os.get_inheritable(fd) for fd in lease.fds)  # only via pass_fds
    lease.release()
    # No descriptor of ours left open. (A subset, not equality: threads of earlier tests in
    # this process may close their own descriptors meanwhile.)
    assert lease.released and _open_fds() <= before
    _plan, again = LeaseManager(lock_dir).allocate(plan_for(inventory, "4"))
    again.release()


def test_child_started_without_pass_fds_does_not_hold_the_lease(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor
) -> None:
    _plan, lease = LeaseManager(lock_dir).allocate(plan_for(inventory, f"device={KEY0}"))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lease.release()
        _plan, taken = LeaseManager(lock_dir).allocate(plan_for(inventory, f"device={KEY0}"))
        assert taken.keys == (KEY0,)
        taken.release()
    finally:
        child.kill()
        child.wait()


def test_shared_uses_a_leased_explicit_device_and_locks_nothing(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor
) -> None:
    _plan, owner = LeaseManager(lock_dir).allocate(plan_for(inventory, f"device={KEY0}"))
    with owner:
        plan, shared = LeaseManager(lock_dir).allocate(
            plan_for(inventory, f"device={KEY0}"), shared=True
        )
        assert plan.lease_keys == (KEY0,)
        assert shared.shared and shared.keys == () and shared.fds == ()
        report = LeaseManager(lock_dir).status()
        assert [(r.key, r.holder.job_id if r.holder else None) for r in report.leases] == [
            (KEY0, owner.job_id)
        ]


def test_shared_count_request_still_avoids_leased_devices(
    lock_dir: Path, one_card: Inventory, plan_for: PlanFor
) -> None:
    one = one_card
    _plan, owner = LeaseManager(lock_dir).allocate(plan_for(one, "1"))
    with owner, pytest.raises(SelectionError, match="only 0 free"):
        LeaseManager(lock_dir).allocate(plan_for(one, "1"), shared=True)
    plan, shared = LeaseManager(lock_dir).allocate(plan_for(one, "1"), shared=True)
    assert plan.lease_keys == (KEY0,) and shared.keys == ()
    assert LeaseManager(lock_dir).status().leases == ()  # free, and still free for others


def test_lock_lost_to_a_race_after_planning_is_device_busy(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor
) -> None:
    import fcntl

    intruder: list[int] = []
    calls: list[Mapping[str, str]] = []

    def racing_plan(unavailable: Mapping[str, str]) -> Plan:
        plan: Plan = plan_for(inventory, "2")(unavailable)
        calls.append(unavailable)
        if len(calls) == 1:
            return plan  # the first plan, with nothing leased, is made before the lock
        # Someone outside the protocol locks the second chosen unit while we plan.
        fd = os.open(lock_dir / lock_file_name(plan.lease_keys[1]), os.O_RDONLY | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        intruder.append(fd)
        return plan

    manager = LeaseManager(lock_dir)
    manager.directory.ensure(create=True)
    before = _open_fds()
    try:
        with pytest.raises(DeviceBusyError, match=f"{KEY1} was leased by another process"):
            manager.allocate(racing_plan)
        assert _open_fds() - before == {str(intruder[0])}  # our own descriptors were closed
        assert not (lock_dir / holder_file_name(KEY0)).exists()
        _plan, lease = LeaseManager(lock_dir).allocate(plan_for(inventory, "1"))
        assert lease.keys == (KEY0,)  # the half-taken KEY0 was let go
        lease.release()
    finally:
        os.close(intruder[0])


def test_stale_holder_file_is_ignored(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor
) -> None:
    lock_dir.mkdir()
    stale = {"key": KEY0, "pid": os.getpid(), "argv": ["old"], "user": "x", "since_s": 1.0}
    stale |= {"job_id": "deadbeef", "hostname": "h"}
    (lock_dir / holder_file_name(KEY0)).write_text(json.dumps(stale))
    (lock_dir / lock_file_name(KEY0)).write_text("")
    manager = LeaseManager(lock_dir)
    assert manager.status().leases == () and manager.unavailable() == {}
    _plan, lease = manager.allocate(plan_for(inventory, "1"))
    with lease:
        assert lease.keys == (KEY0,)
        record = manager.status().leases[0]
        assert record.holder is not None and record.holder.job_id == lease.job_id


def test_held_lock_without_holder_record_still_counts(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor
) -> None:
    import fcntl

    lock_dir.mkdir()
    fd = os.open(lock_dir / lock_file_name(KEY0), os.O_RDONLY | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        manager = LeaseManager(lock_dir)
        assert manager.unavailable() == {KEY0: "another job (its holder record is missing)"}
        [record] = manager.status().leases
        assert record.key == KEY0 and record.holder is None and record.holder_alive is None
        _plan, lease = manager.allocate(plan_for(inventory, "1"))
        assert lease.keys == (KEY1,)
        lease.release()
    finally:
        os.close(fd)


def test_a_leased_device_that_looks_busy_is_named_as_leased_and_waited_for(
    lock_dir: Path,
) -> None:
    """On a GPU host a leased device also looks busy (its holder's memory): the launch must
    say who leases it, and --wait must wait for it, not fail as for a request never met."""
    import sys

    import xpulaunch
    from xpulaunch.model import Device, Vendor

    def host(used_bytes: int) -> Inventory:
        card = Device(Vendor.NVIDIA, 0, name="H100", pci_bus_id=KEY0, uuid="GPU-1",
                      memory_total_bytes=80 * 2**30, memory_used_bytes=used_bytes)  # fmt: skip
        return Inventory((card,))

    holder = LeaseManager(lock_dir)

    def plan_fn(held: Mapping[str, str]) -> Plan:  # the holder's job uses 40 GiB while leased
        busy = holder_lease is not None and not holder_lease.released
        inventory = host(40 * 2**30 if busy else 0)
        argv = [sys.executable, "-c", "pass"]
        return xpulaunch.plan(argv, gpus="1", inventory=inventory, parent_env={}, unavailable=held)

    holder_lease = None
    _plan, holder_lease = holder.allocate(plan_fn)
    with pytest.raises(SelectionError, match="leased by"):
        LeaseManager(lock_dir).allocate(plan_fn)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2 and holder_lease is not None:
            holder_lease.release()

    _plan, lease = LeaseManager(lock_dir, sleep=sleep).allocate(plan_fn, wait=True)
    assert lease.keys == (KEY0,) and len(sleeps) >= 2
    lease.release()
