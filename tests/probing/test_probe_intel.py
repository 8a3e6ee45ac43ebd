"""Intel: sysfs (i915 backport lmem, xe tiles), xpu-smi 1.x/2.x, pyzes (sections 2.5-2.7, 6)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from probe_fake_pyzes import ZES_MEM_LOC_DEVICE, ZES_MEM_LOC_SYSTEM, FakePyzes
from probe_fakes import (
    GIB,
    MAX1550,
    MAX1550_LMEM_BYTES,
    MIB,
    ROOT_CAPS,
    XPU_SMI_V1,
    XPU_SMI_V2,
    FakeMachine,
    FakeNvml,
    b580_uhd_host,
    by_bus,
    calls,
    h200_host,
    max1550_backport_host,
    max1550_cards,
    messages,
    nvml_h200,
    probe_fake,
    tool_path,
    write_tool,
)

from xpulaunch.model import Vendor

MASKS = {
    "ZE_AFFINITY_MASK": "1",
    "ONEAPI_DEVICE_SELECTOR": "level_zero:1",
    "ZE_FLAT_DEVICE_HIERARCHY": "FLAT",
    "SYCL_DEVICE_FILTER": "level_zero:gpu:1",
}
B580_CARDS = [
    {"index": 0, "name": "Intel(R) Arc(TM) B580 Graphics", "bdf": "0000:03:00.0",
     "uuid": "00000000-0000-0003-0000-0000e20b8086", "total_mib": 12216, "used_mib": 0, "util": 0},
    {"index": 1, "name": "Intel(R) UHD Graphics 770", "bdf": "0000:00:02.0",
     "uuid": "00000000-0000-0000-0000-0000a7808086", "total_mib": 0, "used_mib": 0, "util": 0},
]  # fmt: skip


def test_max1550_backport_lmem_needs_no_tool(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    max1550_backport_host(m)
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "xpu-smi", XPU_SMI_V1, cards=max1550_cards(), interval_s=0.1)
    inv = probe_fake(m, bin_dir)
    assert calls(bin_dir) == []
    assert [(d.vendor, d.index, d.pci_bus_id, d.tiles, d.integrated) for d in inv.devices] == [
        (Vendor.INTEL, 0, "0000:29:00.0", 2, False),
        (Vendor.INTEL, 1, "0000:9a:00.0", 2, False),
    ]
    card0, card1 = inv.devices
    assert card0.name == "Intel(R) Data Center GPU Max 1550"
    assert card0.memory_total_bytes == MAX1550_LMEM_BYTES  # whole card, both tiles
    assert (card0.memory_used_bytes, card1.memory_used_bytes) == (8 * GIB, 32 * GIB)
    assert card0.extra["sources"] == ["sysfs-lmem"]
    assert inv.problems == ()


def test_xpu_smi_1x_runs_without_the_parent_masks(tmp_path: Path) -> None:
    """xpu-smi 1.x inherits masks: the fake honours ZE_AFFINITY_MASK like 1.x does, so only a
    stripped environment sees both cards under their real PCI addresses."""
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "xpu-smi", XPU_SMI_V1, cards=max1550_cards(), interval_s=0.1)
    masked = subprocess.run(
        [str(bin_dir / "xpu-smi"), "discovery", "-j"],
        env={"PATH": tool_path(bin_dir), "ZE_AFFINITY_MASK": "1"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert masked.stdout.count("pci_bdf_address") == 1 and "0000:9a:00.0" in masked.stdout

    m = FakeMachine(tmp_path / "m")
    for card in MAX1550:  # upstream i915: no lmem files, so memory must come from xpu-smi
        m.pci(card["bdf"], vendor=0x8086, device=0x0BD5, cls=0x038000, driver="i915",
              drm=(card["minor"],))  # fmt: skip
    inv = probe_fake(m, bin_dir, env=MASKS)
    card0, card1 = inv.devices
    assert (card0.pci_bus_id, card0.uuid) == (MAX1550[0]["bdf"], MAX1550[0]["uuid"])
    assert (card1.pci_bus_id, card1.uuid) == (MAX1550[1]["bdf"], MAX1550[1]["uuid"])
    assert card0.memory_total_bytes == MAX1550_LMEM_BYTES
    assert card0.memory_used_bytes == round(26.31 * MIB)
    assert card1.memory_used_bytes == round(40102.55 * MIB)
    assert (card0.utilization_percent, card1.utilization_percent) == (0.0, 97.5)
    assert card1.tiles == 2
    for call in calls(bin_dir, "xpu-smi")[1:]:
        assert all(call["env"][name] is None for name in MASKS), call
    dumps = [c["argv"] for c in calls(bin_dir, "xpu-smi") if c["argv"][0] == "dump"]
    assert dumps == [["dump", "-d", "0,1", "-m", "0,5,18", "-n", "1"]]  # no -j: 1.x refuses it
    assert all(p.source != "intel" for p in inv.problems), messages(inv)


def test_xpu_smi_1x_stuck_dump_times_out_keeping_identity(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    for card in MAX1550:
        m.pci(card["bdf"], vendor=0x8086, device=0x0BD5, cls=0x038000, driver="i915")
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "xpu-smi", XPU_SMI_V1, cards=max1550_cards(), interval_s=30)
    inv = probe_fake(m, bin_dir, timeout_s=1.0)
    assert "xpu-smi: timed out after 1 s and was killed" in messages(inv)
    assert [d.uuid for d in inv.devices] == [c["uuid"] for c in MAX1550]
    # the dump died, so used falls back to physical - free of `discovery -d N -j`
    assert inv.devices[0].memory_total_bytes == MAX1550_LMEM_BYTES
    assert inv.devices[0].memory_used_bytes == round(26.31 * MIB)
    assert inv.devices[0].utilization_percent is None
    for call in calls(bin_dir):
        with pytest.raises(ProcessLookupError):
            os.kill(call["pid"], 0)


@pytest.fixture
def b580(tmp_path: Path) -> FakeMachine:
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    return m


def test_b580_xe_and_igpu_order_and_unprivileged_zero(b580: FakeMachine, tmp_path: Path) -> None:
    """Discrete before integrated although the iGPU has the lower PCI address and is card0;
    an unprivileged "0 used" from xpu-smi 2.x is unknown (i915/xe show free == total to it)."""
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "xpu-smi", XPU_SMI_V2, cards=B580_CARDS)
    inv = probe_fake(b580, bin_dir)
    arc, uhd = inv.devices
    assert (arc.index, arc.pci_bus_id, arc.integrated, arc.tiles) == (0, "0000:03:00.0", False, 1)
    assert (uhd.index, uhd.pci_bus_id, uhd.integrated) == (1, "0000:00:02.0", True)
    assert arc.name == "Intel(R) Arc(TM) B580 Graphics"
    assert arc.uuid == "00000000-0000-0003-0000-0000e20b8086"
    assert arc.memory_total_bytes == 12 * GIB  # xe tile0/physical_vram_size_bytes
    assert arc.memory_used_bytes is None
    assert "CAP_PERFMON" in messages(inv) and "0000:03:00.0" in messages(inv)


def test_b580_root_reading_of_zero_is_trusted(b580: FakeMachine, tmp_path: Path) -> None:
    b580.set_caps(ROOT_CAPS)
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "xpu-smi", XPU_SMI_V2, cards=B580_CARDS)
    inv = probe_fake(b580, bin_dir)
    assert by_bus(inv)["0000:03:00.0"].memory_used_bytes == 0
    assert inv.problems == ()


def test_no_tool_says_what_was_tried(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    b580_uhd_host(m, vram_file=False)
    inv = probe_fake(m)
    arc = by_bus(inv)["0000:03:00.0"]
    assert (arc.memory_total_bytes, arc.memory_used_bytes) == (None, None)
    (problem,) = inv.problems
    assert problem.device == "0000:03:00.0"
    assert "memory total and used unknown" in problem.message
    assert "xpu-smi: not installed" in problem.message
    assert by_bus(inv)["0000:00:02.0"].memory_total_bytes is None  # iGPU: shares system RAM


def test_igpu_only_host_runs_no_tool(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    m.pci("0000:00:02.0", vendor=0x8086, device=0x7D55, cls=0x030000, driver="xe", drm=(0,),
          tiles=1)  # fmt: skip
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "xpu-smi", XPU_SMI_V2, cards=[])
    inv = probe_fake(m, bin_dir)
    assert [(d.integrated, d.tiles) for d in inv.devices] == [(True, 1)]
    assert calls(bin_dir) == [] and inv.problems == ()


def _zes_b580(free: int) -> FakePyzes:
    return FakePyzes([
        {"bdf": "0000:00:02.0", "device_id": 0xA780, "name": "Intel(R) UHD Graphics 770",
         "integrated": True, "subdevices": 0, "modules": [(ZES_MEM_LOC_SYSTEM, 32 * GIB, GIB)]},
        {"bdf": "0000:03:00.0", "device_id": 0xE20B, "name": "Intel(R) Arc(TM) B580 Graphics",
         "integrated": False, "subdevices": 0,
         "modules": [(ZES_MEM_LOC_DEVICE, 12 * GIB - 256 * MIB, free)]},
    ])  # fmt: skip


def test_pyzes_when_xpu_smi_is_missing(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path, caps=ROOT_CAPS)
    b580_uhd_host(m, vram_file=False)
    inv = probe_fake(m, use_pyzes=True, pyzes_module=_zes_b580(free=10 * GIB))
    arc, uhd = inv.devices
    assert arc.memory_total_bytes == 12 * GIB - 256 * MIB
    assert arc.memory_used_bytes == 2 * GIB - 256 * MIB
    assert uhd.memory_total_bytes is None  # system memory modules do not count
    assert arc.extra["sources"] == ["sysfs", "pyzes"]
    assert inv.problems == ()


def test_pyzes_unprivileged_free_equals_size_is_unknown(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    b580_uhd_host(m, vram_file=False)
    inv = probe_fake(m, use_pyzes=True, pyzes_module=_zes_b580(free=12 * GIB - 256 * MIB))
    arc = by_bus(inv)["0000:03:00.0"]
    assert arc.memory_total_bytes == 12 * GIB - 256 * MIB
    assert arc.memory_used_bytes is None
    assert "CAP_PERFMON" in messages(inv)


FAKE_PYZES = """
import os
with open(os.environ["FAKE_PYZES_LOG"], "a") as log:
    log.write("imported\\n")
# what the real module does without Level Zero: CDLL() of a fixed path at import time
raise OSError("/usr/lib/x86_64-linux-gnu/libze_loader.so.1: cannot open shared object file")
"""


def test_pyzes_is_imported_only_when_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Importing pyzes loads a .so from a fixed path and raises without it."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "pyzes.py").write_text(FAKE_PYZES)
    log = tmp_path / "pyzes.log"
    monkeypatch.setenv("FAKE_PYZES_LOG", str(log))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))

    backport = FakeMachine(tmp_path / "backport")
    max1550_backport_host(backport)
    assert probe_fake(backport, use_pyzes=True).problems == ()
    assert not log.exists()  # lmem files answered everything: pyzes never loaded

    xe = FakeMachine(tmp_path / "xe")
    b580_uhd_host(xe, vram_file=False)
    inv = probe_fake(xe, use_pyzes=True)
    assert log.read_text() == "imported\n"
    assert "pyzes: not importable: /usr/lib/x86_64-linux-gnu/libze_loader.so.1" in messages(inv)


def test_tool_card_unknown_to_sysfs_is_ignored(b580: FakeMachine, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    ghost = {**B580_CARDS[0], "index": 2, "bdf": "0000:0a:00.0", "uuid": "ghost"}
    write_tool(bin_dir, "xpu-smi", XPU_SMI_V2, cards=[*B580_CARDS, ghost])
    inv = probe_fake(b580, bin_dir, report_missing=True)
    assert "0000:0a:00.0" not in by_bus(inv)
    assert "does not list as usable" in messages(inv)


def test_hybrid_nvidia_and_intel_are_numbered_per_vendor(tmp_path: Path) -> None:
    """DRM numbering interleaves vendors; each vendor keeps its own index space."""
    m = FakeMachine(tmp_path, caps=ROOT_CAPS)
    h200_host(m)
    b580_uhd_host(m)
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "xpu-smi", XPU_SMI_V2, cards=B580_CARDS)
    inv = probe_fake(m, bin_dir, nvml_module=FakeNvml(nvml_h200()))
    assert [(d.vendor.value, d.index, d.pci_bus_id) for d in inv.devices] == [
        ("nvidia", 0, "0000:00:06.0"),
        ("nvidia", 1, "0000:00:07.0"),
        ("intel", 0, "0000:03:00.0"),
        ("intel", 1, "0000:00:02.0"),
    ]
    assert inv.problems == ()
