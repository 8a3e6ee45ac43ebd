"""--wait: a first-come-first-served queue of live waiters, with status and a timeout."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import wait_for
from xpulaunch.errors import SelectionError, WaitTimeoutError
from xpulaunch.leases import LeaseManager
from xpulaunch.leases.wait_queue import WaitStatus
from xpulaunch.model import Inventory

PlanFor = Callable[..., Any]  # the plan_for fixture (tests/leases/conftest.py)
Processes = Any  # the processes fixture (tests/leases/conftest.py)


class FakeClock:
    """A monotonic clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now_s = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now_s += seconds


def _tickets(lock_dir: Path) -> list[str]:
    return sorted(n for n in os.listdir(lock_dir) if n.endswith(".ticket"))


def test_wait_timeout_reports_what_it_waited_for(
    lock_dir: Path, one_card: Inventory, plan_for: PlanFor
) -> None:
    _plan, holder = LeaseManager(lock_dir).allocate(plan_for(one_card, "1"), command=["hog"])
    clock = FakeClock()
    seen: list[WaitStatus] = []
    waiter = LeaseManager(lock_dir, clock=clock, sleep=clock.sleep, poll_interval_s=0.2)
    with holder, pytest.raises(WaitTimeoutError) as info:
        waiter.allocate(plan_for(one_card, "1"), wait=True, wait_timeout_s=1.0, on_wait=seen.append)
    message = info.value.message
    assert message.startswith("gave up after waiting 1 s (--wait-timeout 1): --gpus 1: only 0 free")
    assert f"leased by pid {os.getpid()} (hog, user" in message
    assert sum(clock.sleeps) == pytest.approx(1.0) and max(clock.sleeps) <= 0.2 + 1e-9
    assert [s.position for s in seen] == [1] * len(seen) and len(seen) == 5
    assert [round(s.waited_s, 6) for s in seen] == [0.0, 0.2, 0.4, 0.6, 0.8]
    assert all(s.timeout_s == 1.0 and "only 0 free" in s.reason for s in seen)
    assert _tickets(lock_dir) == []  # the ticket left with the waiter


def test_real_timeout_without_fake_clock(
    lock_dir: Path, one_card: Inventory, plan_for: PlanFor
) -> None:
    _plan, holder = LeaseManager(lock_dir).allocate(plan_for(one_card, "1"))
    start = time.monotonic()
    with holder, pytest.raises(WaitTimeoutError):
        LeaseManager(lock_dir, poll_interval_s=0.05).allocate(
            plan_for(one_card, "1"), wait=True, wait_timeout_s=0.3
        )
    assert 0.3 <= time.monotonic() - start < 2.0


def test_waiter_gets_the_device_once_it_is_free(
    lock_dir: Path, one_card: Inventory, plan_for: PlanFor
) -> None:
    _plan, holder = LeaseManager(lock_dir).allocate(plan_for(one_card, "1"))
    clock = FakeClock()

    def release_on_third_sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 3:
            holder.release()

    waiter = LeaseManager(lock_dir, clock=clock, sleep=release_on_third_sleep)
    _plan, lease = waiter.allocate(plan_for(one_card, "1"), wait=True)
    assert lease.keys == ("0000:01:00.0",) and len(clock.sleeps) == 3
    lease.release()


def test_request_that_can_never_be_met_fails_at_once(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor
) -> None:
    sleeps: list[float] = []
    with pytest.raises(SelectionError, match="only 4 device"):
        LeaseManager(lock_dir, sleep=sleeps.append).allocate(plan_for(inventory, "5"), wait=True)
    assert sleeps == [] and not lock_dir.exists()  # refused before anything was touched


def test_explicit_busy_device_is_waited_for(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor
) -> None:
    key = "0000:03:00.0"
    _plan, holder = LeaseManager(lock_dir).allocate(plan_for(inventory, f"device={key}"))
    clock = FakeClock()
    seen: list[WaitStatus] = []
    waiter = LeaseManager(lock_dir, clock=clock, sleep=clock.sleep)
    with holder, pytest.raises(WaitTimeoutError, match=f"{key} is leased by pid"):
        waiter.allocate(
            plan_for(inventory, f"device={key}"), wait=True, wait_timeout_s=0.4, on_wait=seen.append
        )
    assert seen and all(f"{key} is leased by pid {os.getpid()}" in s.reason for s in seen)


def test_waiters_go_first_come_first_served_and_dead_ones_drop_out(
    lock_dir: Path, one_card: Inventory, plan_for: PlanFor, processes: Processes, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.txt"
    manager = LeaseManager(lock_dir)
    _plan, holder = manager.allocate(plan_for(one_card, "1"), command=["blocker"])
    waiters = []
    for count in range(1, 5):  # A, B, D (killed below), C: one at a time, in a known order
        waiters.append(
            processes.worker(
                lock_dir,
                "--devices",
                "1",
                "--gpus",
                "1",
                "--wait",
                "hold",
                "--seconds",
                "0.1",
                "--audit",
                str(audit),
            )
        )
        wait_for(lambda n=count: len(manager.status().waiting) == n)
    report = manager.status()
    assert [w.holder.pid for w in report.waiting if w.holder] == [p.pid for p in waiters]
    assert [w.position for w in report.waiting] == [1, 2, 3, 4]
    assert report.waiting[0].waiting_for is not None
    assert "only 0 free" in report.waiting[0].waiting_for
    assert "leased by pid" in report.waiting[0].waiting_for

    dead = waiters.pop(2)
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait()
    wait_for(lambda: len(manager.status().waiting) == 3)
    assert [w.holder.pid for w in manager.status().waiting if w.holder] == [p.pid for p in waiters]

    holder.release()
    for proc in waiters:
        proc.wait(timeout=20)
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    order = [int(line.split()[3]) for line in audit.read_text().splitlines()]
    assert order == [p.pid for p in waiters]
    assert manager.status().waiting == () and _tickets(lock_dir) == []
