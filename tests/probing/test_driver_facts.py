"""Driver versions read without initialising a driver, and the known-bad table they feed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from probe_fakes import FakeMachine, b580_uhd_host, by_bus, probe_fake
from test_probe_cli_devices import fake_host_env, xpulaunch

from xpulaunch.core.known_issues import issues_of, version_tuple
from xpulaunch.model import Device, Vendor

DPKG = """Package: libze-intel-gpu1
Status: install ok installed
Priority: optional
Architecture: amd64
Version: {version}
Description: Intel(R) Graphics Compute Runtime for oneAPI Level Zero.
 Level Zero is the primary low-level interface for language and runtime

Package: libze-intel-gpu1-legacy1
Status: install ok installed
Version: 24.35.30872.32-1

Package: zlib1g
Status: install ok installed
Version: 1:1.3.dfsg-3.1ubuntu2
"""


def _b580(driver: str, version: str | None, device_id: str = "0xe20b") -> Device:
    extra: dict[str, object] = {"driver": driver, "pci_device_id": device_id}
    if version is not None:
        extra["level_zero_version"] = version
    return Device(Vendor.INTEL, 0, "Intel(R) Arc(TM) B580 Graphics", "0000:03:00.0", extra=extra)


@pytest.mark.parametrize(
    ("device", "flagged"),
    [(_b580("xe", "25.18.33578.6"), True), (_b580("xe", "25.35.35096.9-1~24.04"), True),
     (_b580("xe", "26.09.37435.1"), False), (_b580("xe", "25.13.33276.16"), False),
     (_b580("i915", "25.18.33578.6"), False), (_b580("xe", "25.18.33578.6", "0x56a0"), False),
     (_b580("xe", None), False), (_b580("xe", "build 33578"), False)],
)  # fmt: skip
def test_the_b_series_host_memory_mirror_is_flagged_with_its_fix(
    device: Device, flagged: bool
) -> None:
    warnings = issues_of(device)
    assert bool(warnings) is flagged
    if flagged:
        assert "upgrade compute-runtime (Level Zero GPU driver) to 26.09 or later" in warnings[0]
        assert "pytorch/pytorch#180145" in warnings[0]


def test_versions_read_with_an_epoch_and_a_debian_revision() -> None:
    assert version_tuple("1:25.18.33578.6-1ubuntu1") == (25, 18, 33578, 6)
    assert version_tuple("no digits") is None


def _host(tmp_path: Path, *, dpkg_version: str | None, library: str | None = None) -> FakeMachine:
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    (m.proc / "sys" / "kernel").mkdir(parents=True)
    (m.proc / "sys" / "kernel" / "osrelease").write_text("6.14.0-29-generic\n")
    if dpkg_version is not None:
        (tmp_path / "var" / "lib" / "dpkg").mkdir(parents=True)
        (tmp_path / "var" / "lib" / "dpkg" / "status").write_text(DPKG.format(version=dpkg_version))
    if library is not None:
        (tmp_path / "usr" / "lib" / "x86_64-linux-gnu").mkdir(parents=True)
        (tmp_path / "usr" / "lib" / "x86_64-linux-gnu" / library).write_text("")
    return m


def test_the_probe_records_kernel_and_level_zero_driver_versions(tmp_path: Path) -> None:
    b580 = by_bus(probe_fake(_host(tmp_path, dpkg_version="25.18.33578.6")))["0000:03:00.0"]
    assert b580.extra["driver"] == "xe"
    assert b580.extra["driver_version"] == "in-tree (kernel 6.14.0-29-generic)"
    assert b580.extra["level_zero_version"] == "25.18.33578.6"
    assert b580.extra["level_zero_legacy1"] is True


def test_without_a_package_record_the_library_name_gives_the_build(tmp_path: Path) -> None:
    m = _host(tmp_path, dpkg_version=None, library="libze_intel_gpu.so.1.6.33578")
    assert by_bus(probe_fake(m))["0000:03:00.0"].extra["level_zero_version"] == "build 33578"


def test_devices_and_plans_show_the_warning(tmp_path: Path) -> None:
    env = fake_host_env(_host(tmp_path, dpkg_version="25.18.33578.6"))
    table = xpulaunch("devices", env=env)
    assert table.returncode == 0, table.stderr
    assert "warnings:" in table.stdout and "to 26.09 or later" in table.stdout
    plan = xpulaunch("run", "--dry-run", "--json", "--gpus", "0000:03:00.0", "x.py", env=env)
    assert plan.returncode == 0, plan.stderr
    notes = json.loads(plan.stdout)["notes"]
    assert any(n.startswith("warning: intel 0") and "host memory" in n for n in notes)
