"""``--list-devices`` is slow and may hang: it runs before the lock directory's lock, and a
timeout ends the real binary behind a wrapper script too."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from fault_cli import Launch, finish
from helpers import INVENTORIES, wait_for
from xpulaunch.errors import ProbeError
from xpulaunch.llamacpp.binary import list_devices

FAKE = Path(__file__).parents[1] / "llamacpp" / "fake_cuda_server.py"


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_a_slow_device_listing_holds_no_other_launch_up(launch: Launch, tmp_path: Path) -> None:
    locks, listing = tmp_path / "locks", tmp_path / "listing"
    slow = _script(
        tmp_path / "slow-llama",
        f'[ "$1" = --list-devices ] && {{ touch {listing}; sleep 4; }}\n'
        f'exec {sys.executable} {FAKE} "$@"\n',
    )
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    inventory = str(INVENTORIES / "2x-h200.json")
    common = ("--lock-dir", str(locks), "--inventory", inventory, "--gpus", "1")
    server = launch("llama", "-m", str(model), "--binary", slow, *common)
    try:
        wait_for(listing.exists, "the server's binary to be asked for its devices")
        started = time.monotonic()
        proc = launch("run", *common, "true", env={"XPULAUNCH_LOCK_TIMEOUT": "2"})
        code, _, err = finish(proc)
        # It used to wait for the listing under allocate.lock, then fail blaming "something".
        assert code == 0, err
        assert time.monotonic() - started < 2.5
    finally:
        server.send_signal(signal.SIGTERM)
        finish(server)


def test_a_hung_listing_behind_a_wrapper_leaves_no_process(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    wrapper = _script(tmp_path / "wrapper", f"sleep 300 & echo $! > {child}\nwait\n")
    with pytest.raises(ProbeError, match=r"did not answer within 0\.5 s"):
        list_devices(wrapper, dict(os.environ), timeout_s=0.5)
    real = psutil.Process(int(child.read_text()))
    try:
        wait_for(lambda: not real.is_running() or real.status() == psutil.STATUS_ZOMBIE,
                 "the real binary to be killed", timeout_s=5)  # fmt: skip
    finally:
        if real.is_running():
            real.kill()
