"""Matching ``VulkanN`` names to inventory devices (pure)."""

from __future__ import annotations

import pytest
from llama_fakes import LISTINGS

from helpers import load_inventory
from xpulaunch.errors import SelectionError
from xpulaunch.llamacpp.devices import LlamaDevice, parse_list_devices
from xpulaunch.llamacpp.vulkan import match_devices, replica_devices
from xpulaunch.model import Device, Inventory, Unit, Vendor

MIB = 1024 * 1024


def vk(*lines: str) -> tuple[LlamaDevice, ...]:
    return parse_list_devices("Available devices:\n" + "".join(f"  {x}\n" for x in lines)).devices


def test_identical_cards_pair_in_pci_order_and_the_plan_says_so() -> None:
    inventory = load_inventory("2x-h200.json")
    matched, notes = match_devices(inventory, parse_list_devices(LISTINGS["vulkan"]).devices)
    assert matched["0000:00:06.0"].name == "Vulkan0"
    assert matched["0000:00:07.0"].name == "Vulkan1"
    assert any("look alike" in n and "not verified on hardware" in n for n in notes)
    assert all("[unv]" not in n for n in notes)  # no internal tags in what a user reads


def test_hybrid_host_matches_each_vendor_by_name_whatever_the_vulkan_order() -> None:
    inventory = load_inventory("hybrid-4090-arc.json")
    listed = vk(
        "Vulkan0: Intel(R) Arc(tm) A770 Graphics (DG2) (16032 MiB, 16032 MiB free)",
        "Vulkan1: NVIDIA GeForce RTX 4090 (24564 MiB, 23000 MiB free)",
    )
    matched, notes = match_devices(inventory, listed)
    assert matched["0000:01:00.0"].name == "Vulkan1"  # the NVIDIA card
    assert matched["0000:04:00.0"].name == "Vulkan0"  # the Arc, despite "(tm)" and "(DG2)"
    assert notes == ()


def test_memory_tells_apart_cards_of_one_name() -> None:
    small = Device(Vendor.AMD, 0, "AMD Radeon PRO W7900", "0000:03:00.0",
                   memory_total_bytes=32 * 1024 * MIB)  # fmt: skip
    big = Device(Vendor.AMD, 1, "AMD Radeon PRO W7900", "0000:04:00.0",
                 memory_total_bytes=48 * 1024 * MIB)  # fmt: skip
    listed = vk(
        "Vulkan0: AMD Radeon PRO W7900 (RADV NAVI31) (49136 MiB, 49000 MiB free)",
        "Vulkan1: AMD Radeon PRO W7900 (RADV NAVI31) (32752 MiB, 32000 MiB free)",
    )
    matched, _ = match_devices(Inventory((small, big)), listed)
    assert matched[small.key].name == "Vulkan1" and matched[big.key].name == "Vulkan0"


def test_unnamed_device_matches_by_vendor_word() -> None:
    device = Device(Vendor.AMD, 0, None, "0000:03:00.0")
    listed = vk(
        "Vulkan0: NVIDIA H200 (1 MiB, 1 MiB free)",
        "Vulkan1: Radeon RX 7900 XTX (1 MiB, 1 MiB free)",
    )
    matched, _ = match_devices(Inventory((device,)), listed)
    assert matched[device.key].name == "Vulkan1"


def test_a_unit_without_a_vulkan_device_is_an_error_listing_what_vulkan_has() -> None:
    inventory = load_inventory("2x-h200.json")
    listed = vk("Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (64000 MiB, 64000 MiB free)")
    matched, _ = match_devices(inventory, listed)
    with pytest.raises(SelectionError, match=r"nvidia 0 .*no Vulkan device.*llvmpipe.*--device"):
        replica_devices((Unit(inventory.devices[0]),), matched, listed)


def test_tiles_of_one_card_are_one_vulkan_device() -> None:
    inventory = load_inventory("2x-max1550.json")
    listed = vk(
        "Vulkan0: Intel(R) Data Center GPU Max 1550 (131072 MiB, 130000 MiB free)",
        "Vulkan1: Intel(R) Data Center GPU Max 1550 (131072 MiB, 130000 MiB free)",
    )
    matched, _ = match_devices(inventory, listed)
    card = inventory.devices[1]
    names = replica_devices((Unit(card, 0), Unit(card, 1)), matched, listed)
    assert [d.name for d in names] == ["Vulkan1"]
