"""Leases with the real planner (``core.plan.make_plan``): tiles and cards of one Intel Max card
conflict across jobs that use different Level Zero hierarchies."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from helpers import load_inventory
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.errors import DeviceBusyError
from xpulaunch.leases import LeaseManager
from xpulaunch.model import Plan

CARD0, CARD1 = "0000:29:00.0", "0000:9a:00.0"


def _planner(gpus: str, hierarchy: str) -> Callable[[Mapping[str, str]], Plan]:
    inventory = load_inventory("2x-max1550.json")
    request = LaunchRequest(argv=("python", "train.py"), gpus=gpus, master_port=29500)
    env = {"ZE_FLAT_DEVICE_HIERARCHY": hierarchy}
    return lambda unavailable: make_plan(request, inventory, env, unavailable=unavailable)


def test_a_leased_tile_keeps_a_composite_job_off_its_card(lock_dir: Path) -> None:
    _plan, tile_job = LeaseManager(lock_dir).allocate(_planner("1", "FLAT"))
    with tile_job:
        assert tile_job.keys == (f"{CARD0}/tile0",)
        plan, card_job = LeaseManager(lock_dir).allocate(_planner("1", "COMPOSITE"))
        with card_job:
            assert card_job.keys == (CARD1,) == plan.lease_keys
            assert any("leased by pid" in note and CARD0 in note for note in plan.notes)
            # Both cards are now taken, one as a tile, one whole: FLAT sees tile1 of card 0.
            _p, last = LeaseManager(lock_dir).allocate(_planner("1", "FLAT"))
            assert last.keys == (f"{CARD0}/tile1",)
            last.release()


def test_an_explicit_card_with_a_leased_tile_is_busy(lock_dir: Path) -> None:
    _plan, tile_job = LeaseManager(lock_dir).allocate(
        _planner("0.1", "FLAT"), command=["python", "train.py"]
    )
    with tile_job, pytest.raises(DeviceBusyError, match=r"leased by pid \d+ \(python train.py"):
        LeaseManager(lock_dir).allocate(_planner(CARD0, "COMPOSITE"))
    assert tile_job.keys == (f"{CARD0}/tile1",)
