"""Unit key -> lock file name: safe, one-to-one, and reversible."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from xpulaunch.leases import LeaseManager
from xpulaunch.leases.lock_files import (
    HolderInfo,
    holder_file_name,
    key_of_lock_file,
    lock_file_name,
)


def test_tile_key_is_escaped() -> None:
    assert lock_file_name("0000:29:00.0/tile1") == "unit-0000%3A29%3A00.0%2Ftile1.lock"
    assert holder_file_name("0000:29:00.0/tile1") == "unit-0000%3A29%3A00.0%2Ftile1.holder"
    assert key_of_lock_file("unit-0000%3A29%3A00.0%2Ftile1.lock") == "0000:29:00.0/tile1"


@pytest.mark.parametrize(
    "key", ["..", ".", "../../etc/passwd", "a%2Fb", "GPU-ü/tile0", "MIG-GPU-1/2/0", "nvidia:0"]
)
def test_awkward_keys_stay_inside_the_directory(key: str) -> None:
    name = lock_file_name(key)
    assert "/" not in name and not name.startswith(".")
    assert key_of_lock_file(name) == key


def test_very_long_key_is_hashed_to_a_legal_name() -> None:
    key = "GPU-" + "ü" * 300
    name = lock_file_name(key)
    assert len(name.encode()) <= 255
    assert key_of_lock_file(name) is None  # the key then comes from the holder file
    assert lock_file_name(key + "x") != name


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80), st.text(max_size=80))
def test_names_are_safe_and_one_to_one(a: str, b: str) -> None:
    name_a, name_b = lock_file_name(a), lock_file_name(b)
    for name in (name_a, name_b):
        assert "/" not in name and "\0" not in name and not name.startswith(".")
        assert len(name.encode()) <= 255
    assert (name_a == name_b) == (a == b)
    assert key_of_lock_file(name_a) in (a, None)


def test_a_tile_lease_creates_exactly_its_file_in_the_lock_dir(tmp_path: Path) -> None:
    from xpulaunch.model import Backend, Device, Plan, Unit, Vendor

    card = Device(Vendor.INTEL, 0, pci_bus_id="0000:29:00.0", tiles=2)
    manager = LeaseManager(tmp_path / "locks")
    _plan, lease = manager.allocate(lambda _u: Plan(Backend.XPU, (Unit(card, 1),), (), None))
    with lease:
        assert lease.keys == ("0000:29:00.0/tile1",)
        assert sorted(os.listdir(tmp_path / "locks")) == [
            "allocate.lock",
            "unit-0000%3A29%3A00.0%2Ftile1.holder",
            "unit-0000%3A29%3A00.0%2Ftile1.lock",
        ]
        assert sorted(os.listdir(tmp_path)) == ["locks"]
        assert manager.unavailable().keys() == {"0000:29:00.0/tile1"}


def test_a_holder_that_is_gone_is_not_named_as_if_it_ran() -> None:
    """A lease outlives the xpulaunch that recorded it (its workers hold it): a message that
    named that pid alone sent users to kill a process that was gone, or another one that got
    the pid since."""
    me = HolderInfo.of_this_process("j1", ["xpulaunch", "train.py"])
    assert me.describe().startswith(f"pid {me.pid} (xpulaunch train.py, user ")
    assert me.pid_started_s is not None
    reused = replace(me, pid_started_s=me.pid_started_s - 3600)  # our pid, once another's
    child = subprocess.Popen(["true"])
    child.wait()
    gone = replace(me, pid=child.pid)
    for holder in (reused, gone):
        text = holder.describe()
        assert text.startswith(f"pid {holder.pid}, which has exited (xpulaunch train.py, user ")
        assert text.endswith("; processes it started still hold it)")
