"""Partitioned AMD Instinct cards: one device per ROCr agent, with its own memory and mask.

sysfs shows one PCI function per card; the KFD topology shows one GPU node per partition, and
ROCr numbers and names agents from it. Each test re-derives what a child's ROCr would expose
from the mask the plan wrote.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kfd_fakes import CPX_BANK_BYTES, FIXTURES, kfd_node, partitioned_card
from probe_fakes import FakeMachine, messages, probe_fake

from xpulaunch.core.masks.rocm import format_rocr_visible_devices
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.core.visibility import parent_visible
from xpulaunch.errors import SelectionError
from xpulaunch.model import Device, Inventory, Unit, Vendor
from xpulaunch.probing.parsers.kfd import KfdNode, parse_properties

CARD, OTHER = "0000:0c:00.0", "0000:22:00.0"
UNIQUE = 0xDC91284879207F2B  # the rocminfo CPX sample's agent: GPU-dc91284879207f2b


def _mi300x(m: FakeMachine, *, modes: tuple[str, str] | None) -> None:
    attrs = {"mem_info_vram_total": "206141652992\n", "mem_info_vram_used": "7028736\n",
             "gpu_busy_percent": "3\n", "unique_id": f"{UNIQUE:016x}\n"}  # fmt: skip
    if modes is not None:
        attrs |= {"current_compute_partition": modes[0] + "\n",
                  "current_memory_partition": modes[1] + "\n"}  # fmt: skip
    m.pci(CARD, vendor=0x1002, device=0x74A1, cls=0x038000, driver="amdgpu", drm=(1,), attrs=attrs)
    m.pci(OTHER, vendor=0x1002, device=0x74A1, cls=0x038000, driver="amdgpu", drm=(2,),
          attrs={"mem_info_vram_total": "206141652992\n", "mem_info_vram_used": "0\n",
                 "unique_id": "7700000000000001\n",
                 "current_compute_partition": "SPX\n"})  # fmt: skip


def _host(tmp_path: Path, *, shared_uuid: bool = False, high_bits: bool = True) -> Inventory:
    m = FakeMachine(tmp_path)
    _mi300x(m, modes=("CPX", "NPS4"))
    kfd_node(m.sys, 0)  # the CPU node
    partitioned_card(m.sys, 1, bus=0x0C, partitions=8, high_bits=high_bits,
                     shared_uuid=shared_uuid, unique_base=UNIQUE)  # fmt: skip
    kfd_node(m.sys, 9, simd=304, location_id=0x22 << 8, unique_id=0x7700000000000001, minor=137)
    return probe_fake(m)


def test_the_kfd_sample_reads_as_a_24_gib_partition() -> None:
    bank = parse_properties((FIXTURES / "amd" / "kfd-node-mem_banks-cpx.txt").read_text())
    assert bank["size_in_bytes"] == CPX_BANK_BYTES and bank["heap_type"] == 1


def test_each_cpx_partition_is_a_device_in_rocr_order(tmp_path: Path) -> None:
    inv = _host(tmp_path)
    amd = inv.of(Vendor.AMD)
    assert len(amd) == 9
    assert [d.pci_bus_id for d in amd[:8]] == [f"0000:0c:00.{p}" for p in range(8)]
    assert amd[0].uuid == "GPU-dc91284879207f2b"  # as rocminfo spells this agent
    assert all(d.memory_total_bytes == CPX_BANK_BYTES for d in amd[:8])
    assert all(d.memory_used_bytes is None for d in amd[:8])  # the card's reading is shared
    assert amd[3].extra["partition_mode"] == "CPX/NPS4" and amd[3].extra["partition"] == 3
    assert (amd[8].pci_bus_id, amd[8].index, amd[8].uuid) == (OTHER, 8, "GPU-7700000000000001")


def test_old_kernels_put_the_partition_in_the_function_bits(tmp_path: Path) -> None:
    """rocm-smi --showbus on one MI300 in TPX (fixture) shows 0000:01:00.1, .2 the same way."""
    amd = _host(tmp_path, high_bits=False).of(Vendor.AMD)
    assert [d.pci_bus_id for d in amd[:8]] == [f"0000:0c:00.{p}" for p in range(8)]
    showbus = (FIXTURES / "amd" / "rocm-smi-showbus-mi300-tpx.txt").read_text()
    node = KfdNode(node=2, unique_id=1, domain=0, location_id=(0x01 << 8) | 2)
    assert f"PCI Bus: {node.card_bus_id[:-1]}{node.partition}" in showbus


def _child_sees(inv: Inventory, gpus: str, parent: dict[str, str] | None = None) -> tuple:
    plan = make_plan(LaunchRequest(argv=("x",), gpus=gpus), inv, parent or {})
    child = plan.workers[0].child_env(parent or {})
    return plan, parent_visible(inv, Vendor.AMD, child, hierarchy=None).units


def test_a_partition_and_the_card_after_it_get_masks_rocr_resolves_to_them(
    tmp_path: Path,
) -> None:
    inv = _host(tmp_path)
    amd = inv.of(Vendor.AMD)
    plan, seen = _child_sees(inv, "amd:8")
    assert plan.workers[0].env["ROCR_VISIBLE_DEVICES"] == "GPU-7700000000000001"
    assert seen == (Unit(amd[8]),)
    plan, seen = _child_sees(inv, "0000:0c:00.5")
    assert seen == plan.devices == (Unit(amd[5]),)


def test_partitions_sharing_a_uuid_are_named_by_rocr_index(tmp_path: Path) -> None:
    """Before ROCm 7.0.1 partitions share one id: ROCr refuses the ambiguous token."""
    inv = _host(tmp_path, shared_uuid=True)
    amd = inv.of(Vendor.AMD)
    assert all(d.uuid is None for d in amd[:8]) and "share one ROCr UUID" in messages(inv)
    plan, seen = _child_sees(inv, "amd:5")
    assert plan.workers[0].env["ROCR_VISIBLE_DEVICES"] == "5"  # agent 5 = partition 5
    assert seen == (Unit(amd[5]),)
    parent = {"ROCR_VISIBLE_DEVICES": f"GPU-{UNIQUE:016x}"}
    seen = parent_visible(inv, Vendor.AMD, parent, hierarchy=None)
    assert seen.units == ()
    assert any("8 partitions (CPX/NPS4)" in n and "ambiguous" in n for n in seen.notes)


def test_a_partitioned_card_without_a_kfd_topology_is_refused_naming_the_mode(
    tmp_path: Path,
) -> None:
    m = FakeMachine(tmp_path)
    _mi300x(m, modes=("CPX", "NPS4"))
    inv = probe_fake(m)
    assert "CPX/NPS4 mode" in messages(inv) and "cannot be told apart" in messages(inv)
    with pytest.raises(SelectionError, match="CPX/NPS4 partition mode"):
        make_plan(LaunchRequest(argv=("x",), gpus="amd:0"), inv, {})
    # the other card is named by its own UUID, which no partition count can shift
    plan, _ = _child_sees(inv, "amd:1")
    assert plan.workers[0].env["ROCR_VISIBLE_DEVICES"] == "GPU-7700000000000001"


def test_amd_smi_uuids_are_never_written_as_rocr_masks() -> None:
    """amd-smi's uuid form (fixture: two DPX partitions sharing abff74a1-0000-1000-...) is not
    ROCr's GPU-<16 hex>: a device carrying one is named by index."""
    choices = (FIXTURES / "amd" / "amd-smi-gpu-choices-dpx.txt").read_text()
    uuid = choices.split("UUID: ")[1].split()[0]
    assert uuid.startswith("abff74a1-0000-1000")
    device = Device(Vendor.AMD, 1, "MI300X", "0000:05:00.1", uuid)
    assert format_rocr_visible_devices([device]) == "1"
