"""The PCI walk over fake /sys trees (reference sections 2.6, 4.5, 5.2)."""

from __future__ import annotations

from pathlib import Path

from probe_fakes import (
    ROOT_CAPS,
    FakeMachine,
    b580_uhd_host,
    h200_host,
    max1550_backport_host,
)

from xpulaunch.model import Vendor
from xpulaunch.probing.sysfs import count_tiles, list_pci_gpus, perfmon_capable


def test_h200_vm_without_class_drm(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    h200_host(m)
    assert not (m.sys / "class" / "drm").exists()
    gpus, problems = list_pci_gpus(m.sys)
    assert problems == []
    assert gpus is not None
    # audio function, ASPEED VGA and host bridge are not GPUs of ours
    assert [(g.bus_id, g.vendor, g.driver, g.class_code) for g in gpus] == [
        ("0000:00:06.0", Vendor.NVIDIA, "nvidia", 0x030200),
        ("0000:00:07.0", Vendor.NVIDIA, "nvidia", 0x030200),
    ]
    assert all(g.drm_cards == () for g in gpus)


def test_drm_cards_skip_connectors_and_render_nodes(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    gpus, _ = list_pci_gpus(m.sys)
    assert gpus is not None
    by_bus = {g.bus_id: g for g in gpus}
    assert by_bus["0000:00:02.0"].drm_cards == ("card0",)
    assert by_bus["0000:03:00.0"].drm_cards == ("card1",)
    assert count_tiles(by_bus["0000:03:00.0"]) == 1
    assert count_tiles(by_bus["0000:00:02.0"]) is None


def test_sorted_by_pci_address_not_by_drm_minor(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    max1550_backport_host(m)
    m.pci("0000:04:00.0", vendor=0x8086, device=0x56A0, cls=0x030000, driver="i915", drm=(7,))
    gpus, _ = list_pci_gpus(m.sys)
    assert gpus is not None
    assert [g.bus_id for g in gpus] == ["0000:04:00.0", "0000:29:00.0", "0000:9a:00.0"]


def test_accelerator_class_needs_a_gpu_driver(tmp_path: Path) -> None:
    """0x1200 is Intel's NPU (intel_vpu) as well as some compute boards: driver decides."""
    m = FakeMachine(tmp_path)
    m.pci("0000:00:0b.0", vendor=0x8086, device=0x7D1D, cls=0x120000, driver="intel_vpu")
    m.pci("0000:c1:00.0", vendor=0x1002, device=0x74A1, cls=0x120000, driver="amdgpu")
    m.pci("0000:c2:00.0", vendor=0x1002, device=0x74A1, cls=0x120000)
    gpus, _ = list_pci_gpus(m.sys)
    assert gpus is not None
    assert [g.bus_id for g in gpus] == ["0000:c1:00.0"]


def test_unbound_display_device_is_listed_without_driver(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    m.pci("0000:65:00.0", vendor=0x10DE, device=0x2330, cls=0x030200, driver="vfio-pci")
    m.pci("0000:66:00.0", vendor=0x10DE, device=0x2330, cls=0x030200)
    gpus, _ = list_pci_gpus(m.sys)
    assert gpus is not None
    assert [(g.driver, g.has_gpu_driver) for g in gpus] == [("vfio-pci", False), (None, False)]


def test_garbage_attribute_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    path = m.pci("0000:65:00.0", vendor=0x10DE, device=0x2330, cls=0x030200, driver="nvidia")
    (path / "device").write_text("banana\n")
    gpus, problems = list_pci_gpus(m.sys)
    assert gpus is not None and gpus[0].device_id is None
    assert len(problems) == 1 and "banana" in problems[0].message


def test_unreadable_pci_dir_returns_none_and_says_why(tmp_path: Path) -> None:
    gpus, problems = list_pci_gpus(tmp_path / "no-sys")
    assert gpus is None
    assert problems[0].source == "sysfs" and "cannot list" in problems[0].message


def test_perfmon_from_capeff(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    assert perfmon_capable(m.proc) is False
    m.set_caps(ROOT_CAPS)
    assert perfmon_capable(m.proc) is True
    m.set_caps(1 << 38)  # CAP_PERFMON alone
    assert perfmon_capable(m.proc) is True
    assert perfmon_capable(tmp_path / "nowhere") is False
