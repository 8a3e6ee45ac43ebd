"""A lock directory that others hold or plant files in: a deadline and a message naming who."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fault_cli import Launch, finish
from helpers import wait_for
from xpulaunch.leases.lock_files import lock_file_name

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
open(sys.argv[1] + ".held", "w").close()
time.sleep(600)
"""
BUS = "0000:01:00.0"


def inventory(tmp_path: Path) -> str:
    path = tmp_path / "inventory.json"
    device = {"vendor": "nvidia", "index": 0, "name": "NVIDIA H100", "pci_bus_id": BUS}
    path.write_text(json.dumps({"schema": "xpulaunch.inventory/1", "devices": [device]}))
    return str(path)


def test_a_held_allocation_lock_times_out_naming_its_holder(launch: Launch, tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    lock = locks / "allocate.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)])
    try:
        wait_for(Path(f"{lock}.held").exists, "the stranger to hold allocate.lock")
        proc = launch(
            "run", "--lock-dir", str(locks), "--inventory", inventory(tmp_path), "--gpus", "1",
            "true", env={"XPULAUNCH_LOCK_TIMEOUT": "1"},
        )  # fmt: skip
        code, _, err = finish(proc, timeout_s=60)  # it used to wait for ever, silently
    finally:
        holder.kill()
        holder.wait()
    assert code != 0
    [line] = err.strip().splitlines()
    assert "allocate.lock has been locked for 1 s by" in line
    assert f"pid {holder.pid}" in line


def test_a_planted_lease_file_names_its_owner(launch: Launch, tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    os.mkdir(locks / lock_file_name(BUS))  # not a regular file: the device cannot be leased
    proc = launch("run", "--lock-dir", str(locks), "--inventory", inventory(tmp_path), "true")
    code, _, err = finish(proc)
    assert code != 0
    [line] = err.strip().splitlines()
    assert "is not a regular file" in line
    assert f"made by user {_me()}" in line


def test_a_read_only_lock_directory_is_named_not_an_owner(
    launch: Launch, small_disk: Callable[[int], Path], tmp_path: Path
) -> None:
    locks = small_disk(1 << 19) / "locks"
    locks.mkdir(mode=0o700)
    subprocess.run(["mount", "-o", "remount,ro", str(locks.parent)], check=True)
    gpu = ("run", "--inventory", inventory(tmp_path), "--gpus", "1", "true")
    for args in (("status",), gpu):
        code, _, err = finish(launch(*args, "--lock-dir", str(locks)))
        [line] = err.strip().splitlines()  # it named "an unknown user" of a file never made
        assert (code, line.split("; ")[0]) == (
            1,
            f"xpulaunch: error: cannot create {locks}/allocate.lock: Read-only file system",
        ), err


def test_a_relative_xdg_runtime_dir_writes_nothing_here(launch: Launch, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "rel").mkdir(parents=True)
    proc = launch("run", "true", cwd=work, env={"XDG_RUNTIME_DIR": "rel"})
    code, _, err = finish(proc)
    assert code == 0, err
    assert list((work / "rel").iterdir()) == []


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def test_sigint_stops_a_waiting_launch_even_when_ignored_at_start(
    launch: Launch, tmp_path: Path
) -> None:
    import signal

    locks = tmp_path / "locks"
    inv = inventory(tmp_path)
    marker = tmp_path / "holding"
    hold = f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(600)"
    holder = launch("run", "--lock-dir", str(locks), "--inventory", inv, "--gpus", "1",
                    sys.executable, "-c", hold)  # fmt: skip
    wait_for(marker.exists, "the holder to run")

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    waiter = launch(
        "run", "--lock-dir", str(locks), "--inventory", inv, "--gpus", "1", "--wait", "true",
        preexec_fn=ignore_sigint,
    )  # fmt: skip
    wait_for(lambda: list(locks.glob("wait-*.ticket")), "the waiter to queue")
    waiter.send_signal(signal.SIGINT)
    code, _, err = finish(waiter, timeout_s=30)  # it used to wait on, deaf to SIGINT
    assert code == 130, err
    holder.send_signal(signal.SIGTERM)
    finish(holder)


def test_a_launch_waiting_for_a_named_device_is_not_told_to_wait(
    launch: Launch, tmp_path: Path
) -> None:
    locks, inv, marker = tmp_path / "locks", inventory(tmp_path), tmp_path / "holding"
    hold = f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(600)"
    args = ("run", "--lock-dir", str(locks), "--inventory", inv, "--gpus", f"device={BUS}")
    holder = launch(*args, sys.executable, "-c", hold)
    wait_for(marker.exists, "the holder to run")
    refused = finish(launch(*args, "true"))[2]
    waited = finish(launch(*args, "--wait", "--wait-timeout", "1", "true"))[2]
    holder.send_signal(signal.SIGTERM)
    finish(holder)
    assert "is leased by pid" in refused and "wait with --wait" in refused  # what it may do
    waiting, gave_up = waited.strip().splitlines()  # it waited: no "wait with --wait" now
    assert waiting.startswith("xpulaunch: waiting 0 s of 1 for devices (next in line): ")
    assert gave_up.startswith("xpulaunch: error: gave up after waiting 1 s (--wait-timeout 1): ")
    for line in (waiting, gave_up):
        assert "is leased by pid" in line and "pick another device" not in line


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
@pytest.mark.parametrize(
    "name", ["unit-planted.lock", "slot-planted.0.lock", "wait-000000000009-1.ticket"]
)
def test_a_planted_name_of_no_device_holds_nobody_up(
    launch: Launch, tmp_path: Path, kind: str, name: str
) -> None:
    """Anyone may create names in a shared (1777) lock directory, and nobody may remove
    another's: such a file, named like a lease, a slot or a ticket but for no device of
    ours, used to fail every launch and ``status`` ("cannot open ...: Too many levels of
    symbolic links", "... is not a regular file")."""
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o1777)
    planted = locks / name
    if kind == "symlink":
        planted.symlink_to("/etc/passwd")
    elif kind == "fifo":
        os.mkfifo(planted)
    else:
        planted.mkdir()
    args = ("--lock-dir", str(locks), "--inventory", inventory(tmp_path), "--gpus", "1")
    code, _, err = finish(launch("run", *args, "--wait-timeout", "5", "true"))
    assert code == 0, err
    code, out, err = finish(launch("status", "--lock-dir", str(locks)))
    assert code == 0, err
    assert "no devices are leased" in out
