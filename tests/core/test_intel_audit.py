"""Level Zero rules the driver audit contradicted, each tested against what compute-runtime
and DPC++ do (execution_environment.cpp, devices_base.inl, device_filter.cpp)."""

from __future__ import annotations

import pytest

from helpers import load_inventory
from xpulaunch.core.intel_family import XE_HPC, is_xe_hpc, tiles_in_doubt
from xpulaunch.core.masks.level_zero import parse_ze_affinity_mask, pci_id_order, resolve_hierarchy
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.core.visibility import child_visibility_env, parent_visible
from xpulaunch.errors import MaskError, SelectionError
from xpulaunch.model import Device, Hierarchy, Inventory, Unit, Vendor
from xpulaunch.probing.parsers.intel import PRODUCTS

MAX1550 = tuple(
    Device(Vendor.INTEL, i, "Intel(R) Data Center GPU Max 1550", bdf, tiles=2)
    for i, bdf in enumerate(("0000:29:00.0", "0000:9a:00.0"))
)
MAX1350_UNKNOWN = load_inventory("2x-max1350-tiles-unknown.json")
# every PvcHwConfig id of compute-runtime shared/source/dll/devices/devices_base.inl
DRIVER_PVC_IDS = {0x0BD0, 0x0BD4, 0x0BD5, 0x0BD6, 0x0BD7, 0x0BD8, 0x0BD9, 0x0BDA, 0x0BDB,
                  0x0B69, 0x0B6E}  # fmt: skip


def test_every_max_id_the_driver_knows_is_in_the_product_table() -> None:
    assert set(XE_HPC) == DRIVER_PVC_IDS
    assert set(PRODUCTS) >= DRIVER_PVC_IDS
    assert PRODUCTS[0x0BD7] == ("Intel(R) Data Center GPU Max 1350", 2)


def test_flat_is_the_default_for_every_max_card_even_with_one_tile_recorded() -> None:
    max1100 = Device(Vendor.INTEL, 0, "X", "0000:29:00.0", extra={"pci_device_id": "0x0bd9"})
    assert is_xe_hpc(max1100) and not tiles_in_doubt(max1100)
    assert resolve_hierarchy(None, (max1100,))[0] is Hierarchy.FLAT
    assert resolve_hierarchy(None, MAX1350_UNKNOWN.devices)[0] is Hierarchy.FLAT
    arc = Device(Vendor.INTEL, 0, "Intel(R) Arc(TM) A770 Graphics", "0000:03:00.0")
    assert resolve_hierarchy(None, (arc,))[0] is Hierarchy.COMPOSITE


def test_a_parent_flat_mask_with_tiles_in_doubt_is_refused_not_guessed() -> None:
    with pytest.raises(MaskError, match=r"tile count of intel 0 .*not known for sure"):
        parent_visible(MAX1350_UNKNOWN, Vendor.INTEL, {"ZE_AFFINITY_MASK": "1"}, hierarchy=None)


def test_a_child_flat_mask_with_tiles_in_doubt_is_refused_composite_works() -> None:
    with pytest.raises(MaskError, match="ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE"):
        make_plan(LaunchRequest(argv=("x",), gpus="device=1"), MAX1350_UNKNOWN, {})
    parent = {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}
    plan = make_plan(LaunchRequest(argv=("x",), gpus="device=1"), MAX1350_UNKNOWN, parent)
    assert plan.workers[0].env["ZE_AFFINITY_MASK"] == "1"
    child = plan.workers[0].child_env(parent)
    assert parent_visible(MAX1350_UNKNOWN, Vendor.INTEL, child, hierarchy=None).units == (
        Unit(MAX1350_UNKNOWN.devices[1]),
    )


def test_a_sub_device_selector_under_composite_narrows_to_that_tile() -> None:
    host = Inventory(devices=MAX1550)
    parent = {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ONEAPI_DEVICE_SELECTOR": "level_zero:0.1"}
    visible = parent_visible(host, Vendor.INTEL, parent, hierarchy=None)
    assert visible.units == (Unit(MAX1550[0], 1),)
    # ...and a child given that unit sees exactly it again
    env = child_visibility_env(Vendor.INTEL, visible.units, host, parent, hierarchy=None)
    child = {**parent, **{k: v for k, v in env.items() if v is not None}}
    assert parent_visible(host, Vendor.INTEL, child, hierarchy=None).units == visible.units


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, False), ("", False), ("0", False), ("00", False), ("+0", False), ("1", True),
     ("2", True), ("01", True), (" 1", True), ("-1", True), ("1abc", True), ("true", False),
     ("yes", False), ("0x1", False), ("99999999999999999999", True)],
)  # fmt: skip
def test_pci_id_order_is_read_like_atoll(value: str | None, expected: bool) -> None:
    assert pci_id_order(value) is expected


def test_pci_id_order_2_puts_the_igpu_first_and_children_get_it_spelled_out() -> None:
    host = load_inventory("arc-b580-igpu.json")
    b580, igpu = host.of(Vendor.INTEL)
    parent = {"ZE_ENABLE_PCI_ID_DEVICE_ORDER": "2", "ZE_AFFINITY_MASK": "0"}
    visible = parent_visible(host, Vendor.INTEL, parent, hierarchy=None)
    assert visible.units == (Unit(igpu),)  # pure PCI order: 00:02.0 is device 0
    env = child_visibility_env(Vendor.INTEL, [Unit(b580)], host, parent, hierarchy=None)
    assert env["ZE_ENABLE_PCI_ID_DEVICE_ORDER"] == "1" and env["ZE_AFFINITY_MASK"] == "1"
    plain = child_visibility_env(Vendor.INTEL, [Unit(b580)], host, {}, hierarchy=None)
    assert plain["ZE_ENABLE_PCI_ID_DEVICE_ORDER"] == "0" and plain["ZE_AFFINITY_MASK"] == "0"


@pytest.mark.parametrize("hierarchy", list(Hierarchy))
def test_x_y_z_entries_are_skipped_not_fatal(hierarchy: Hierarchy) -> None:
    seen = parse_ze_affinity_mask("0.1.2,1", MAX1550, hierarchy, pci_order=False)
    assert any("X.Y.Z" in n for n in seen.notes)
    assert seen.units  # the other entry still applies


def test_four_part_entries_naming_a_real_tile_abort_the_driver_under_composite() -> None:
    with pytest.raises(MaskError, match="more than three parts"):
        parse_ze_affinity_mask("0.1.2.3", MAX1550, Hierarchy.COMPOSITE, pci_order=False)


def test_a_gen9_igpu_beside_a_dgpu_warns_that_two_drivers_apply_the_mask() -> None:
    arc = Device(Vendor.INTEL, 0, "Intel(R) Arc(TM) A770 Graphics", "0000:03:00.0",
                 extra={"pci_device_id": "0x56a0"})  # fmt: skip
    uhd630 = Device(Vendor.INTEL, 1, "Intel(R) UHD Graphics 630", "0000:00:02.0",
                    integrated=True, extra={"pci_device_id": "0x3e92"})  # fmt: skip
    notes = parent_visible(Inventory(devices=(arc, uhd630)), Vendor.INTEL, {}, hierarchy=None)
    assert any("legacy1" in n and "each Level Zero driver" in n for n in notes.notes)


def test_auto_and_min_free_memory_agree_on_an_arc_whose_usage_is_unknown() -> None:
    host = load_inventory("arc-b580-igpu.json")
    b580 = host.of(Vendor.INTEL)[0]
    for minimum in (None, 4 * 1024**3):
        request = LaunchRequest(argv=("x",), gpus="auto", min_free_memory_bytes=minimum)
        plan = make_plan(request, host, {})
        assert plan.devices == (Unit(b580),)
        assert any(
            n.startswith("policy: a device whose free memory is unknown") for n in plan.notes
        )
    too_much = LaunchRequest(argv=("x",), gpus="1", min_free_memory_bytes=13 * 1024**3)
    with pytest.raises(SelectionError, match=r"only 12.0 GiB in all"):
        make_plan(too_much, host, {})


def test_no_two_driver_warning_when_the_legacy_driver_is_known_absent() -> None:
    arc = Device(Vendor.INTEL, 0, "Intel(R) Arc(TM) A770 Graphics", "0000:03:00.0",
                 extra={"pci_device_id": "0x56a0", "level_zero_legacy1": False})  # fmt: skip
    uhd630 = Device(Vendor.INTEL, 1, "Intel(R) UHD Graphics 630", "0000:00:02.0",
                    integrated=True,
                    extra={"pci_device_id": "0x3e92", "level_zero_legacy1": False})  # fmt: skip
    seen = parent_visible(Inventory(devices=(arc, uhd630)), Vendor.INTEL, {}, hierarchy=None)
    assert not any("legacy1" in n for n in seen.notes)
