"""AMD: amdgpu sysfs, then amd-smi or rocm-smi, joined on PCI address (sections 5.2-5.4)."""

from __future__ import annotations

from pathlib import Path

from probe_fakes import (
    AMD_SMI,
    ROCM_SMI,
    FakeMachine,
    by_bus,
    calls,
    messages,
    mi300x_host,
    probe_fake,
    write_tool,
)

from xpulaunch.model import Vendor

MI300X_BDFS = ["0000:0c:00.0", "0000:22:00.0"]


def _bare_mi300x(m: FakeMachine) -> None:
    """MI300X boards whose kernel lacks the mem_info files (or whose files are unreadable)."""
    for i, bdf in enumerate(MI300X_BDFS):
        m.pci(bdf, vendor=0x1002, device=0x74A1, cls=0x038000, driver="amdgpu", drm=(i + 1,))


def test_sysfs_gives_everything(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    mi300x_host(m)
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "rocm-smi", ROCM_SMI, cards=[])
    inv = probe_fake(m, bin_dir)
    assert [(d.vendor, d.index, d.pci_bus_id) for d in inv.devices] == [
        (Vendor.AMD, 0, MI300X_BDFS[0]), (Vendor.AMD, 1, MI300X_BDFS[1]),
    ]  # fmt: skip
    gpu = inv.devices[0]
    assert (gpu.memory_total_bytes, gpu.memory_used_bytes) == (34342961152, 7028736)
    assert gpu.utilization_percent == 0.0
    assert gpu.name == "AMD Instinct MI300X"
    assert gpu.uuid == "GPU-4b2c1a9f0c1d2e30"
    assert calls(bin_dir) == [] and inv.problems == ()


def test_rocm_smi_card_index_is_not_the_drm_card(tmp_path: Path) -> None:
    """rocm-smi's card0 is the SMI index. Here the SMI lists the boards in the
    reverse order of their DRM minors; the join is on the PCI address, never on the number."""
    m = FakeMachine(tmp_path)
    _bare_mi300x(m)
    bin_dir = tmp_path / "bin"
    cards = [
        {"bdf": MI300X_BDFS[1], "total": 206141652992, "used": 5 * 2**30, "util": 40},
        {"bdf": MI300X_BDFS[0], "total": 206141652992, "used": 7028736, "util": 0},
    ]
    write_tool(bin_dir, "rocm-smi", ROCM_SMI, cards=cards)
    inv = probe_fake(m, bin_dir, env={"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0"})
    devices = by_bus(inv)
    assert devices[MI300X_BDFS[0]].memory_used_bytes == 7028736
    assert devices[MI300X_BDFS[1]].memory_used_bytes == 5 * 2**30
    assert devices[MI300X_BDFS[1]].utilization_percent == 40.0
    (call,) = calls(bin_dir, "rocm-smi")
    assert (
        call["env"]["ROCR_VISIBLE_DEVICES"] is None and call["env"]["HIP_VISIBLE_DEVICES"] is None
    )
    assert inv.problems == ()


def test_amd_smi_is_preferred_and_na_stays_unknown(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    _bare_mi300x(m)
    bin_dir = tmp_path / "bin"
    cards = [
        {"bdf": MI300X_BDFS[0], "uuid": "4bff74a1-0000", "total": 192 * 2**30, "used": 6 * 2**20},
        {"bdf": MI300X_BDFS[1], "uuid": "5cff74a1-0000", "total": 192 * 2**30, "used": None},
    ]
    write_tool(bin_dir, "amd-smi", AMD_SMI, cards=cards)
    write_tool(bin_dir, "rocm-smi", ROCM_SMI, cards=[])
    inv = probe_fake(m, bin_dir)
    first, second = inv.devices
    assert (first.memory_total_bytes, first.memory_used_bytes) == (192 * 2**30, 6 * 2**20)
    assert second.memory_used_bytes is None
    # amd-smi's uuid is not ROCr's: never an id or a ROCR_VISIBLE_DEVICES entry
    assert first.uuid is None and first.extra["amd_smi_uuid"] == "4bff74a1-0000"
    assert [c["argv"][0] for c in calls(bin_dir)] == ["list", "metric"]  # rocm-smi not needed
    assert "memory unknown" in messages(inv) and MI300X_BDFS[1] in messages(inv)


def test_no_smi_tool_explains_unknown_memory(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    _bare_mi300x(m)
    inv = probe_fake(m)
    assert all(d.memory_total_bytes is None for d in inv.devices)
    text = messages(inv)
    assert "amd-smi: not installed" in text and "rocm-smi: not installed" in text


def test_amdgpu_not_bound_is_skipped_with_a_reason(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    mi300x_host(m)
    m.pci("0000:3d:00.0", vendor=0x1002, device=0x74A1, cls=0x038000, driver="vfio-pci")
    inv = probe_fake(m)
    assert len(inv.devices) == 2
    assert "0000:3d:00.0" in messages(inv) and "not amdgpu" in messages(inv)
