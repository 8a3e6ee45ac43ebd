"""Data Center GPU Max parts on i915 without xpu-smi: the product table gives the tiles, and
the 2023 backport's tile-0-only lmem_total_bytes is detected."""

from __future__ import annotations

from pathlib import Path

from probe_fakes import GIB, FakeMachine, messages, probe_fake

from xpulaunch.core.masks.level_zero import resolve_hierarchy
from xpulaunch.model import Hierarchy, Vendor

BDFS = ("0000:29:00.0", "0000:9a:00.0")


def _max_cards(m: FakeMachine, device: int, lmem_total: int) -> None:
    for minor, bdf in enumerate(BDFS, start=1):
        m.pci(bdf, vendor=0x8086, device=device, cls=0x038000, driver="i915", drm=(minor,))
        m.drm_attr(minor, "lmem_total_bytes", f"{lmem_total}\n")
        m.drm_attr(minor, "lmem_avail_bytes", f"{lmem_total - GIB}\n")


def test_a_max_1350_without_xpu_smi_gets_its_two_tiles_from_the_table(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    _max_cards(m, 0x0BD7, 96 * GIB)
    cards = probe_fake(m).of(Vendor.INTEL)
    assert [(c.name, c.tiles) for c in cards] == [("Intel(R) Data Center GPU Max 1350", 2)] * 2
    assert cards[0].memory_total_bytes == 96 * GIB and cards[0].memory_used_bytes == GIB
    assert resolve_hierarchy(None, cards)[0] is Hierarchy.FLAT


def test_the_backport_reporting_tile_0_only_is_detected(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    _max_cards(m, 0x0BD5, 64 * GIB)  # a 128 GiB Max 1550 showing one tile's memory
    inventory = probe_fake(m)
    card = inventory.of(Vendor.INTEL)[0]
    assert card.memory_total_bytes == 128 * GIB
    assert card.memory_used_bytes is None  # tile 1's use is not in the file
    assert "covers tile 0 only" in messages(inventory)
