"""``devices --processes``: DRM fdinfo (i915/xe/amdgpu) read from a fake /proc laid out like
the kernel's, and the fdinfo format of drm-usage-stats.rst."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from probe_fakes import (
    GIB,
    ROOT_CAPS,
    FakeMachine,
    FakeNvml,
    b580_uhd_host,
    by_bus,
    mi300x_host,
    probe_fake,
)
from test_probe_cli_devices import fake_host_env, xpulaunch

from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.leases import LeaseManager
from xpulaunch.model import Device, DeviceShare, Vendor
from xpulaunch.probing.gpu_processes import gpu_processes
from xpulaunch.probing.parsers.fdinfo import parse_fdinfo

# drm-usage-stats.rst's sample (i915), plus xe's and amdgpu's region names
I915 = """pos:\t0
flags:\t0100002
mnt_id:\t24
ino:\t1234
drm-driver:\ti915
drm-client-id:\t7
drm-pdev:\t0000:03:00.0
drm-engine-render:\t9288864 ns
drm-total-system0:\t4 KiB
drm-total-local0:\t1024 KiB
drm-resident-local0:\t512 KiB
"""
XE = "drm-driver:\txe\ndrm-client-id:\t9\ndrm-pdev:\t0000:03:00.0\ndrm-total-vram0:\t2 MiB\n"
AMDGPU_OLD = "drm-driver:\tamdgpu\ndrm-pdev:\t0000:0c:00.0\ndrm-client-id:\t3\ndrm-memory-vram:\t2048 KiB\ndrm-memory-gtt:\t8 KiB\n"  # noqa: E501


@pytest.mark.parametrize(
    ("text", "driver", "bus", "memory"),
    [(I915, "i915", "0000:03:00.0", 512 * 1024), (XE, "xe", "0000:03:00.0", 2 * 1024**2),
     (AMDGPU_OLD, "amdgpu", "0000:0c:00.0", 2048 * 1024)],
)  # fmt: skip
def test_fdinfo_device_memory_per_driver(text: str, driver: str, bus: str, memory: int) -> None:
    client = parse_fdinfo(text)
    assert client is not None
    assert (client.driver, client.pci_bus_id, client.device_memory_bytes) == (driver, bus, memory)


def test_a_file_that_is_not_a_drm_client_is_none() -> None:
    assert parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t3\n") is None


def _process(m: FakeMachine, pid: int, fdinfo: dict[int, str], env: dict[str, str]) -> None:
    base = m.proc / str(pid)
    (base / "fdinfo").mkdir(parents=True)
    for fd, text in fdinfo.items():
        (base / "fdinfo" / str(fd)).write_text(text)
    (base / "cmdline").write_bytes(b"python3\0train.py\0")
    (base / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))


def test_devices_processes_lists_drm_clients_once_each(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    mi300x_host(m)
    # a real lease on the B580, held by this test process for the job the process names
    inventory = probe_fake(m)
    request = LaunchRequest(argv=("x",), gpus="0000:03:00.0")
    manager = LeaseManager(tmp_path / "locks")
    _, lease = manager.allocate(lambda held: make_plan(request, inventory, {}, unavailable=held))
    # two fds of one DRM client count once; a second client of the same process adds up
    _process(m, 4242, {5: XE, 6: XE, 7: XE.replace("client-id:\t9", "client-id:\t10")},
             {"XPULAUNCH_JOB_ID": lease.job_id})  # fmt: skip
    _process(m, 4343, {3: AMDGPU_OLD}, {})
    _process(m, 4444, {0: "pos:\t0\n"}, {})  # no GPU
    env = {**fake_host_env(m), "XPULAUNCH_LOCK_DIR": str(tmp_path / "locks")}
    out = xpulaunch("devices", "--json", "--processes", env=env)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["processes"]
    by_pid = {r["pid"]: r for r in rows}
    assert set(by_pid) == {4242, 4343}
    assert by_pid[4242]["pci_bus_id"] == "0000:03:00.0" and by_pid[4242]["device"] == "intel:0"
    assert by_pid[4242]["memory_bytes"] == 4 * 1024**2
    assert by_pid[4242]["command"] == "python3 train.py"
    assert by_pid[4242]["xpulaunch_job"] == lease.job_id and by_pid[4242]["lease_covers"] is True
    assert by_pid[4343]["device"] == "amd:0" and by_pid[4343]["source"] == "fdinfo"
    assert by_pid[4343]["lease_covers"] is False  # nothing leases that card
    table = xpulaunch("devices", "--processes", env=env)
    assert table.returncode == 0, table.stderr
    assert "PROCESSES" in table.stdout and "python3 train.py" in table.stdout
    assert f"{4 * 1024**2 / GIB:.2f} GiB" in table.stdout
    lease.release()


def test_lease_column_of_a_process_outside_the_lease_and_of_a_slot_job(
    tmp_path: Path,
) -> None:
    """LEASE is "no" for a process whose environment names no job on a leased device (the
    squatter the column is there to show), "?" only when that environment is unreadable;
    a job holding a slot of a shared device (--slots-per-gpu) covers its own processes."""
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    mi300x_host(m)
    inventory = probe_fake(m)
    manager = LeaseManager(tmp_path / "locks")
    whole = LaunchRequest(argv=("x",), gpus="0000:03:00.0")
    _, lease = manager.allocate(lambda held: make_plan(whole, inventory, {}, unavailable=held))
    share = DeviceShare(slots=2)
    small = LaunchRequest(argv=("x",), gpus="0000:0c:00.0", share=share)
    _, slot = manager.allocate(
        lambda held: make_plan(small, inventory, {}, unavailable=held), share=share
    )
    _process(m, 4242, {5: XE}, {"HOME": "/home/bob"})  # readable: no xpulaunch job
    _process(m, 4343, {5: XE}, {})
    (m.proc / "4343" / "environ").unlink()  # unreadable (another user's, without root)
    _process(m, 4444, {3: AMDGPU_OLD}, {"XPULAUNCH_JOB_ID": slot.job_id})
    env = {**fake_host_env(m), "XPULAUNCH_LOCK_DIR": str(tmp_path / "locks")}
    out = xpulaunch("devices", "--json", "--processes", env=env)
    assert out.returncode == 0, out.stderr
    covers = {r["pid"]: r["lease_covers"] for r in json.loads(out.stdout)["processes"]}
    assert covers == {4242: False, 4343: None, 4444: True}
    slot.release()
    lease.release()


def test_an_inventory_file_lists_no_processes_and_says_why(tmp_path: Path) -> None:
    path = Path(__file__).parents[1] / "fixtures" / "inventories" / "2x-h200.json"
    out = xpulaunch("devices", "--processes", "--inventory", os.fspath(path))
    assert out.returncode == 0, out.stderr
    assert "not listed: the inventory comes from a file" in out.stdout


def test_a_root_probe_knows_an_intel_cards_memory_in_use_from_fdinfo(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path, caps=ROOT_CAPS)
    b580_uhd_host(m)
    _process(m, 4242, {5: XE, 6: XE}, {})
    b580 = by_bus(probe_fake(m))["0000:03:00.0"]
    assert b580.memory_used_bytes == 2 * 1024**2  # one client, counted once
    user = FakeMachine(tmp_path / "user")
    b580_uhd_host(user)
    _process(user, 4242, {5: XE}, {})
    assert by_bus(probe_fake(user))["0000:03:00.0"].memory_used_bytes is None  # not complete


def test_nvml_compute_processes_are_joined_on_the_pci_address() -> None:
    """This test process stands in for a CUDA process: its /proc entries are real."""
    gpus = [
        {"bus": "00000000:00:06.0", "processes": [{"pid": os.getpid(), "used": 2 * GIB}]},
        {"bus": "00000000:00:07.0", "processes": [{"pid": os.getpid(), "used": None}]},
    ]
    devices = [Device(Vendor.NVIDIA, i, pci_bus_id=f"0000:00:0{6 + i}.0") for i in range(2)]
    found, problems = gpu_processes(devices, nvml_module=FakeNvml(gpus))
    assert problems == []
    first, second = found
    assert (first.pid, first.device_key, first.memory_bytes) == (
        os.getpid(),
        "0000:00:06.0",
        2 * GIB,
    )
    assert second.memory_bytes is None  # NVML had no value: unknown, not 0
    assert first.user and first.command and "pytest" in first.command


def test_a_process_no_lease_covers_is_named_below_the_table(tmp_path: Path) -> None:
    """A process on a GPU that no lease covers (one that left its job's cgroup and closed the
    lease's descriptor, whose device the job's end then freed; or one started without
    xpulaunch) is named in a footer that says the device may be handed out; a covered one is
    not."""
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    mi300x_host(m)
    inventory = probe_fake(m)
    request = LaunchRequest(argv=("x",), gpus="0000:03:00.0")
    manager = LeaseManager(tmp_path / "locks")
    _, lease = manager.allocate(lambda held: make_plan(request, inventory, {}, unavailable=held))
    _process(m, 4242, {5: XE}, {"XPULAUNCH_JOB_ID": lease.job_id})  # the job's own
    _process(m, 4343, {3: AMDGPU_OLD}, {})  # an escapee with an empty environment
    env = {**fake_host_env(m), "XPULAUNCH_LOCK_DIR": str(tmp_path / "locks")}
    table = xpulaunch("devices", "--processes", env=env)
    assert table.returncode == 0, table.stderr
    footer = table.stdout.split("not covered by a lease: ", 1)[1]
    assert footer.startswith("amd:0 pid 4343\n") and "4242" not in footer
    assert "Only a device cgroup would" in footer
    lease.release()
