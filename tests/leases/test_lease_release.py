"""When ``supervise`` returns, its devices are free at once; never while the job lives.

The supervisor unlocks the leases itself (``flock(LOCK_UN)`` on the open file description
that it, the workers and the guardian share) once it has seen every process of the job gone,
instead of waiting for the guardian to exit (issue 4). Real processes throughout: a driver
like ``xpulaunch run`` allocates one device through ``LeaseManager`` and runs a worker that
leaves a grandchild behind, in its own session, ignoring SIGTERM, holding the inherited lease
fd. The driver keeps its own lease descriptors open after ``supervise`` returns, so the device
can only be free then because the supervisor unlocked it. The SIGKILLed-supervisor case (the
guardian keeps the devices until the job is gone) is test_orphans.py's.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import lock_is_free
from process_kit import alive, wait_for
from xpulaunch.leases import LeaseManager
from xpulaunch.leases.lock_files import lock_file_name
from xpulaunch.model import Backend, Device, Plan, Unit, Vendor

KEY = "0000:01:00.0"

# The worker: fork a grandchild that leaves the session (setsid), ignores SIGTERM, records its
# pid and sleeps; exit 0 once the test says go (it first sees the device held). argv[2] is the
# grandchild's XPULAUNCH_WORKER: the worker's own name, or another one (a process the job's
# marker still names, owned by no worker: the supervisor's last check must find it too).
WORKER = """
import os, signal, sys, time
out, name = sys.argv[1], sys.argv[2]
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    env = {**os.environ, "XPULAUNCH_WORKER": name}
    code = ("import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); "
            "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(600)")
    os.execve(sys.executable, [sys.executable, "-c", code, out], env)
while not os.path.exists(out + ".go"):
    time.sleep(0.01)
"""

# Like `xpulaunch run`: allocate, supervise with the lease fds, say so; keep our descriptors
# until stdin closes (so only an unlock can have freed the device).
DRIVER = """
import json, os, sys
from xpulaunch.model import Backend, Device, Plan, Unit, Vendor, WorkerPlan
from xpulaunch.launch.request import RunRequest
from xpulaunch.launch.run import supervise
from xpulaunch.leases import LeaseManager
lock_dir, key, argv = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
unit = Unit(Device(Vendor.NVIDIA, 0, pci_bus_id=key))
plan_fn = lambda held: Plan(Backend.CUDA, (unit,), (WorkerPlan("0", 0, 0, tuple(argv), {}),), None)
plan, lease = LeaseManager(lock_dir).allocate(plan_fn)
status = supervise(plan, RunRequest(program=("job",), grace_s=0.3), dict(os.environ),
                   lease_fds=lease.fds, release_leases=sys.argv[4] == "release")
print("returned", status, flush=True)
sys.stdin.read()
lease.release()
"""


def _plan(held: object) -> Plan:
    return Plan(Backend.CUDA, (Unit(Device(Vendor.NVIDIA, 0, pci_bus_id=KEY)),), (), None)


def _watch_until_returned(driver: subprocess.Popen[str], lock_file: Path, grandchild: int) -> str:
    """Until the driver says ``returned``: whenever the device is free, the grandchild (which
    holds the lease fd) must already be dead. Checked in this order on purpose: free first,
    then alive, so "free while alive" is never a race of the two looks."""
    assert driver.stdout is not None
    deadline = time.monotonic() + 30
    seen_held = False
    while time.monotonic() < deadline:
        free = lock_is_free(lock_file)
        assert not (free and alive(grandchild)), "the device was free while the job lived"
        seen_held = seen_held or not free
        ready, _, _ = select.select([driver.stdout], [], [], 0.01)
        if ready:
            assert seen_held  # the check above really watched a held lease
            return driver.stdout.readline().strip()
    pytest.fail("supervise did not return")


@pytest.mark.parametrize("marker", ["0", "other"])
def test_devices_are_free_when_supervise_returns(tmp_path: Path, marker: str) -> None:
    lock_dir = tmp_path / "locks"
    pid_file = tmp_path / "grandchild.pid"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = [sys.executable, str(script), str(pid_file), marker]
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(lock_dir), KEY, json.dumps(argv), "release"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    grandchild = 0
    try:
        wait_for(pid_file.exists, timeout_s=20)
        grandchild = int(pid_file.read_text())
        # Watch from before the worker exits: with marker "other" the supervisor kills the
        # grandchild and frees the device within milliseconds of that exit.
        lock_file = lock_dir / lock_file_name(KEY)
        assert not lock_is_free(lock_file)
        Path(f"{pid_file}.go").touch()
        line = _watch_until_returned(driver, lock_file, grandchild)
        assert line == "returned 0"
        assert not alive(grandchild)
        # The driver still holds its lease descriptors (and the guardian may not have exited
        # yet): another launch gets the device at once all the same.
        plan, lease = LeaseManager(lock_dir).allocate(_plan)
        with lease:
            assert plan.lease_keys == (KEY,)
        assert driver.poll() is None
    finally:
        driver.communicate(timeout=20)
        if grandchild and alive(grandchild):  # only after a failure above
            os.kill(grandchild, signal.SIGKILL)
    assert driver.returncode == 0


def test_without_release_the_callers_lease_holds_the_device_after_the_job(tmp_path: Path) -> None:
    """The Python API's default: a caller may run several jobs under one lease, so the device
    stays leased after supervise returns, until the caller releases it."""
    lock_dir = tmp_path / "locks"
    argv = [sys.executable, "-c", "pass"]
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(lock_dir), KEY, json.dumps(argv), "keep"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "returned 0"
        assert not lock_is_free(lock_dir / lock_file_name(KEY))
    finally:
        driver.communicate(timeout=20)  # stdin closes: the driver releases its lease
    assert driver.returncode == 0
    assert lock_is_free(lock_dir / lock_file_name(KEY))
