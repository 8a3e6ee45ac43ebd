"""core.visibility: the parent's visible set per vendor and each child's visibility env.

The property test at the end reads a child's env back with the same runtime models
(core.masks): the child must see exactly its units, and no device of any other vendor.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, strategies as st

from xpulaunch.core.visibility import child_visibility_env, parent_visible
from xpulaunch.errors import MaskError, SelectionError
from xpulaunch.model import Device, Hierarchy, Inventory, MigDevice, Unit, Vendor

U0 = "GPU-a6026e70-2f8a-387f-486f-d49cebe1fb04"
U1 = "GPU-e436550d-4102-c58c-de2e-988dc6aaa541"
H200 = (
    Device(Vendor.NVIDIA, 0, "NVIDIA H200", "0000:00:06.0", U0),
    Device(Vendor.NVIDIA, 1, "NVIDIA H200", "0000:00:07.0", U1),
)
MAX1550 = tuple(
    Device(Vendor.INTEL, i, "Intel(R) Data Center GPU Max 1550", bdf, tiles=2)
    for i, bdf in enumerate(("0000:29:00.0", "0000:9a:00.0"))
)
B580 = Device(Vendor.INTEL, 0, "Intel(R) Arc(TM) B580 Graphics", "0000:03:00.0")
UHD770 = Device(Vendor.INTEL, 1, "Intel(R) UHD Graphics 770", "0000:00:02.0", integrated=True)
RTX4090 = Device(
    Vendor.NVIDIA, 0, "NVIDIA GeForce RTX 4090", "0000:01:00.0", "GPU-5bd8a4f2-8b3c-4f4e"
)
A770 = Device(Vendor.INTEL, 0, "Intel(R) Arc(TM) A770 Graphics", "0000:04:00.0")
MI300X = tuple(
    Device(Vendor.AMD, i, "AMD Instinct MI300X", f"0000:{bus}:00.0", f"GPU-{uid}")
    for i, (bus, uid) in enumerate(
        [
            ("0c", "4b2c1a9f0c1d2e3f"),
            ("22", "5c3d2b0a1d2e3f40"),
            ("38", "6d4e3c1b2e3f4051"),
            ("5c", "7e5f4d2c3f405162"),
        ]
    )
)
MIG = (
    MigDevice("MIG-aaaa0000-0000-5000-8000-000000000001"),
    MigDevice("MIG-aaaa0000-0000-5000-8000-000000000002"),
)
A100_MIG = Device(Vendor.NVIDIA, 0, "NVIDIA A100", "0000:07:00.0", "GPU-0d1e2f30", mig_devices=MIG)


def inv(*devices: Device) -> Inventory:
    return Inventory(devices=devices)


def seen(
    inventory: Inventory,
    vendor: Vendor,
    env: Mapping[str, str],
    hierarchy: Hierarchy | None = None,
) -> list[tuple[int, int | None]]:
    units = parent_visible(inventory, vendor, env, hierarchy=hierarchy).units
    return [(u.device.index, u.tile) for u in units]


def apply(parent_env: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
    env = dict(parent_env)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


# --- parent_visible: NVIDIA -----------------------------------------------------------------


def test_nvidia_unset_empty_and_reordered() -> None:
    host = inv(*H200)
    assert seen(host, Vendor.NVIDIA, {}) == [(0, None), (1, None)]
    assert seen(host, Vendor.NVIDIA, {"CUDA_VISIBLE_DEVICES": "1,0"}) == [(1, None), (0, None)]
    hidden = parent_visible(host, Vendor.NVIDIA, {"CUDA_VISIBLE_DEVICES": ""}, hierarchy=None)
    assert hidden.units == () and hidden.hidden_all
    assert not parent_visible(host, Vendor.NVIDIA, {}, hierarchy=None).hidden_all


def test_nvidia_repeated_device_raises() -> None:
    with pytest.raises(MaskError, match="CUDA_VISIBLE_DEVICES"):
        parent_visible(inv(*H200), Vendor.NVIDIA, {"CUDA_VISIBLE_DEVICES": "0,0"}, hierarchy=None)


def test_nvidia_mixed_models_without_pci_bus_id_order_get_a_note() -> None:
    host = inv(
        RTX4090, Device(Vendor.NVIDIA, 1, "NVIDIA GeForce RTX 3060", "0000:02:00.0", "GPU-x")
    )
    notes = parent_visible(host, Vendor.NVIDIA, {"CUDA_VISIBLE_DEVICES": "1"}, hierarchy=None).notes
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in n for n in notes)
    ordered = {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert not parent_visible(host, Vendor.NVIDIA, ordered, hierarchy=None).notes


def test_mig_gpu_is_its_instances_and_a_parent_mig_mask_keeps_only_that_one() -> None:
    host = inv(A100_MIG)
    unmasked = parent_visible(host, Vendor.NVIDIA, {}, hierarchy=None)
    assert unmasked.units == tuple(Unit(A100_MIG, mig=m) for m in MIG)
    assert any("MIG mode" in n and "one by one" in n for n in unmasked.notes)
    parent = {"CUDA_VISIBLE_DEVICES": MIG[1].uuid}
    visible = parent_visible(host, Vendor.NVIDIA, parent, hierarchy=None)
    assert visible.units == (Unit(A100_MIG, mig=MIG[1]),)
    env = child_visibility_env(Vendor.NVIDIA, visible.units, host, parent, hierarchy=None)
    assert env["CUDA_VISIBLE_DEVICES"] == MIG[1].uuid
    second = child_visibility_env(Vendor.NVIDIA, unmasked.units[1:], host, {}, hierarchy=None)
    assert second["CUDA_VISIBLE_DEVICES"] == MIG[1].uuid
    with pytest.raises(SelectionError, match="a CUDA process uses one"):
        child_visibility_env(Vendor.NVIDIA, unmasked.units, host, {}, hierarchy=None)


# --- parent_visible: Intel ------------------------------------------------------------------


def test_intel_flat_default_one_unit_per_tile() -> None:
    visible = parent_visible(inv(*MAX1550), Vendor.INTEL, {}, hierarchy=None)
    assert [(u.device.index, u.tile) for u in visible.units] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert visible.hierarchy is Hierarchy.FLAT


def test_intel_ze_mask_then_selector_renumbered_from_zero() -> None:
    host = inv(*MAX1550)
    assert seen(host, Vendor.INTEL, {"ZE_AFFINITY_MASK": "1,2"}) == [(0, 1), (1, 0)]
    env = {"ZE_AFFINITY_MASK": "1,2", "ONEAPI_DEVICE_SELECTOR": "level_zero:1"}
    assert seen(host, Vendor.INTEL, env) == [(1, 0)]  # SYCL device 1 = second survivor


def test_intel_selector_without_level_zero_hides_intel() -> None:
    visible = parent_visible(
        inv(*MAX1550), Vendor.INTEL, {"ONEAPI_DEVICE_SELECTOR": "opencl:*"}, hierarchy=None
    )
    assert visible.units == () and visible.hidden_all


def test_intel_composite_selector_counts_cards() -> None:
    env = {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ONEAPI_DEVICE_SELECTOR": "level_zero:1"}
    assert seen(inv(*MAX1550), Vendor.INTEL, env) == [(1, None)]


def test_intel_parent_mask_read_in_parent_hierarchy_regrouped_for_children() -> None:
    host = inv(*MAX1550)
    parent = {"ZE_FLAT_DEVICE_HIERARCHY": "FLAT", "ZE_AFFINITY_MASK": "0,1,2"}
    assert seen(host, Vendor.INTEL, parent, Hierarchy.COMPOSITE) == [(0, None), (1, 0)]
    composite = {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "1"}
    assert seen(host, Vendor.INTEL, composite, Hierarchy.FLAT) == [(1, 0), (1, 1)]
    notes = parent_visible(host, Vendor.INTEL, parent, hierarchy=Hierarchy.COMPOSITE).notes
    assert any("read under FLAT" in n for n in notes)
    assert any("only some tiles" in n for n in notes)


def test_intel_lower_case_hierarchy_is_the_driver_default() -> None:
    env = {"ZE_FLAT_DEVICE_HIERARCHY": "composite", "ZE_AFFINITY_MASK": "1"}
    assert seen(inv(*MAX1550), Vendor.INTEL, env) == [(0, 1)]  # read as FLAT: card 0 tile 1


def test_intel_igpu_order_follows_ze_enable_pci_id_device_order() -> None:
    host = inv(B580, UHD770)
    assert seen(host, Vendor.INTEL, {"ZE_AFFINITY_MASK": "0"}) == [(0, None)]
    pci = {"ZE_AFFINITY_MASK": "0", "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}
    assert seen(host, Vendor.INTEL, pci) == [(1, None)]


def test_intel_obsolete_sycl_filter_is_noted() -> None:
    notes = parent_visible(inv(B580), Vendor.INTEL, {"SYCL_DEVICE_FILTER": "gpu"}, hierarchy=None)
    assert any("SYCL_DEVICE_FILTER is obsolete" in n for n in notes.notes)


def test_hybrid_masks_are_per_vendor() -> None:
    host = inv(RTX4090, A770)
    env = {"CUDA_VISIBLE_DEVICES": ""}
    assert parent_visible(host, Vendor.NVIDIA, env, hierarchy=None).hidden_all
    assert seen(host, Vendor.INTEL, env) == [(0, None)]  # CUDA's mask does not hide Intel


# --- parent_visible: AMD --------------------------------------------------------------------


def test_amd_rocr_then_hip() -> None:
    host = inv(*MI300X)
    assert seen(host, Vendor.AMD, {}) == [(0, None), (1, None), (2, None), (3, None)]
    env = {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}
    assert seen(host, Vendor.AMD, env) == [(3, None)]
    assert parent_visible(host, Vendor.AMD, {"ROCR_VISIBLE_DEVICES": ""}, hierarchy=None).hidden_all


def test_amd_hip_reads_cuda_visible_devices_when_hip_is_unset_or_empty() -> None:
    host = inv(*MI300X)
    for hip in ({}, {"HIP_VISIBLE_DEVICES": ""}):
        env = {"ROCR_VISIBLE_DEVICES": "1,2,3", "CUDA_VISIBLE_DEVICES": "2", **hip}
        visible = parent_visible(host, Vendor.AMD, env, hierarchy=None)
        assert [u.device.index for u in visible.units] == [3]
        assert any("HIP reads CUDA_VISIBLE_DEVICES" in n for n in visible.notes)


def test_amd_host_with_nvidia_uuids_in_cuda_visible_devices_hides_amd_from_hip() -> None:
    env = {"CUDA_VISIBLE_DEVICES": RTX4090.uuid or ""}
    assert parent_visible(inv(RTX4090, *MI300X), Vendor.AMD, env, hierarchy=None).hidden_all


def test_amd_hip_longer_than_rocr_raises() -> None:
    env = {"ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0,1"}
    with pytest.raises(MaskError, match="PyTorch"):
        parent_visible(inv(*MI300X), Vendor.AMD, env, hierarchy=None)


# --- child_visibility_env -------------------------------------------------------------------


def test_nvidia_child_on_nvidia_host() -> None:
    env = child_visibility_env(Vendor.NVIDIA, [Unit(H200[1])], inv(*H200), {}, hierarchy=None)
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": U1}


def test_relative_ordinals_are_never_written_back() -> None:
    # Parent: CUDA_VISIBLE_DEVICES=1, so the child's GPU is the parent's cuda:0 - but the
    # child's mask names the physical device.
    bare = (Device(Vendor.NVIDIA, 0, pci_bus_id="0000:00:06.0"), Device(Vendor.NVIDIA, 1))
    parent = {"CUDA_VISIBLE_DEVICES": "1"}
    (unit,) = parent_visible(inv(*bare), Vendor.NVIDIA, parent, hierarchy=None).units
    env = child_visibility_env(Vendor.NVIDIA, [unit], inv(*bare), parent, hierarchy=None)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    flat = {"ZE_AFFINITY_MASK": "2,3"}
    units = parent_visible(inv(*MAX1550), Vendor.INTEL, flat, hierarchy=None).units
    intel = child_visibility_env(Vendor.INTEL, units, inv(*MAX1550), flat, hierarchy=None)
    assert intel["ZE_AFFINITY_MASK"] == "2,3"


def test_intel_child_flat_tiles() -> None:
    units = [Unit(MAX1550[1], 1), Unit(MAX1550[1], 0)]
    env = child_visibility_env(Vendor.INTEL, units, inv(*MAX1550), {}, hierarchy=Hierarchy.FLAT)
    assert env == {
        "ZE_FLAT_DEVICE_HIERARCHY": "FLAT",
        "ZE_AFFINITY_MASK": "2,3",
        "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "0",
        "ONEAPI_DEVICE_SELECTOR": "level_zero:gpu",
    }


def test_intel_child_composite_card_and_sycl_filter_removed() -> None:
    parent = {"SYCL_DEVICE_FILTER": "level_zero:gpu:0"}
    env = child_visibility_env(
        Vendor.INTEL, [Unit(MAX1550[1])], inv(*MAX1550), parent, hierarchy=Hierarchy.COMPOSITE
    )
    assert env["ZE_FLAT_DEVICE_HIERARCHY"] == "COMPOSITE"
    assert env["ZE_AFFINITY_MASK"] == "1"
    assert env["SYCL_DEVICE_FILTER"] is None


def test_intel_child_hierarchy_defaults_to_the_parents() -> None:
    env = child_visibility_env(Vendor.INTEL, [Unit(B580)], inv(B580, UHD770), {}, hierarchy=None)
    assert env["ZE_FLAT_DEVICE_HIERARCHY"] == "COMPOSITE" and env["ZE_AFFINITY_MASK"] == "0"


def test_hybrid_nvidia_child_hides_intel_and_intel_child_hides_nvidia() -> None:
    host = inv(RTX4090, A770)
    cuda = child_visibility_env(Vendor.NVIDIA, [Unit(RTX4090)], host, {}, hierarchy=None)
    assert cuda == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": RTX4090.uuid,
        "ZE_AFFINITY_MASK": "999",
    }
    xpu = child_visibility_env(Vendor.INTEL, [Unit(A770)], host, {}, hierarchy=None)
    assert xpu["CUDA_VISIBLE_DEVICES"] == ""
    assert xpu["ZE_AFFINITY_MASK"] == "0" and xpu["ONEAPI_DEVICE_SELECTOR"] == "level_zero:gpu"


def test_amd_child_on_amd_host_removes_hip_and_cuda_variables() -> None:
    parent = {"HIP_VISIBLE_DEVICES": "0,1", "GPU_DEVICE_ORDINAL": "0", "CUDA_VISIBLE_DEVICES": "1"}
    units = [Unit(MI300X[2]), Unit(MI300X[0])]
    env = child_visibility_env(Vendor.AMD, units, inv(*MI300X), parent, hierarchy=None)
    assert env == {
        "ROCR_VISIBLE_DEVICES": "GPU-6d4e3c1b2e3f4051,GPU-4b2c1a9f0c1d2e3f",
        "HIP_VISIBLE_DEVICES": None,
        "GPU_DEVICE_ORDINAL": None,
        "CUDA_VISIBLE_DEVICES": None,
    }


def test_amd_child_with_nvidia_present_pins_hip_so_cuda_can_be_hidden() -> None:
    host = inv(RTX4090, *MI300X)
    env = child_visibility_env(
        Vendor.AMD, [Unit(MI300X[3]), Unit(MI300X[1])], host, {}, hierarchy=None
    )
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["HIP_VISIBLE_DEVICES"] == "0,1"
    assert env["ROCR_VISIBLE_DEVICES"] == "GPU-7e5f4d2c3f405162,GPU-5c3d2b0a1d2e3f40"


def test_cpu_child_hides_every_vendor_present() -> None:
    host = inv(RTX4090, A770, MI300X[0])
    env = child_visibility_env(None, [], host, {}, hierarchy=None)
    assert env == {
        "CUDA_VISIBLE_DEVICES": "",
        "ZE_AFFINITY_MASK": "999",
        "ROCR_VISIBLE_DEVICES": "",
    }


def test_cpu_child_writes_nothing_on_a_cpu_host_unless_the_parent_set_variables() -> None:
    assert child_visibility_env(None, [], inv(), {}, hierarchy=None) == {}
    stray = {"ZE_AFFINITY_MASK": "0", "HIP_VISIBLE_DEVICES": "0"}
    env = child_visibility_env(None, [], inv(), stray, hierarchy=None)
    assert env == {
        "ZE_AFFINITY_MASK": "999",
        "ROCR_VISIBLE_DEVICES": "",
        "HIP_VISIBLE_DEVICES": None,
    }


def test_child_units_must_belong_to_the_child_vendor_and_not_repeat() -> None:
    host = inv(RTX4090, A770)
    with pytest.raises(MaskError, match="nvidia child"):
        child_visibility_env(Vendor.NVIDIA, [Unit(A770)], host, {}, hierarchy=None)
    with pytest.raises(MaskError, match="CPU child"):
        child_visibility_env(None, [Unit(A770)], host, {}, hierarchy=None)
    with pytest.raises(MaskError, match="twice"):
        child_visibility_env(Vendor.NVIDIA, [Unit(RTX4090)] * 2, host, {}, hierarchy=None)


# --- property: a child sees exactly its units (read back through the runtime models) --------


@st.composite
def hosts(draw: st.DrawFn) -> Inventory:
    buses = iter(draw(st.permutations(range(1, 40))))
    devices: list[Device] = []
    for i in range(draw(st.integers(0, 3))):
        uuid = draw(st.sampled_from([None, f"GPU-{i:08x}-1111-2222-3333"]))
        migs = draw(
            st.sampled_from([(), (MigDevice(f"MIG-{i:08x}-0001"), MigDevice(f"MIG-{i:08x}-0002"))])
        )
        devices.append(
            Device(Vendor.NVIDIA, i, "N", f"0000:{next(buses):02x}:00.0", uuid, mig_devices=migs)
        )
    for i in range(draw(st.integers(0, 3))):
        tiles, integrated = draw(st.sampled_from([(1, False), (2, False), (1, True)]))
        bdf = f"0000:{next(buses):02x}:00.0"
        devices.append(Device(Vendor.INTEL, i, "I", bdf, tiles=tiles, integrated=integrated))
    for i in range(draw(st.integers(0, 3))):
        uuid = draw(st.sampled_from([None, f"GPU-{i:016x}"]))
        devices.append(Device(Vendor.AMD, i, "A", f"0000:{next(buses):02x}:00.0", uuid))
    return Inventory(devices=tuple(devices))


PARENT_ENVS = st.sampled_from(
    [
        {},
        {"CUDA_VISIBLE_DEVICES": "0", "ZE_AFFINITY_MASK": "0", "ROCR_VISIBLE_DEVICES": "0"},
        {"HIP_VISIBLE_DEVICES": "0", "SYCL_DEVICE_FILTER": "gpu", "GPU_DEVICE_ORDINAL": "0"},
        {"ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1", "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"},
    ]
)


@given(hosts(), PARENT_ENVS, st.sampled_from([None, *Hierarchy]), st.data())
def test_child_env_shows_exactly_its_units(
    host: Inventory,
    parent: dict[str, str],
    hierarchy: Hierarchy | None,
    data: st.DataObject,
) -> None:
    vendors = sorted({d.vendor for d in host.devices}, key=lambda v: v.value)
    vendor = data.draw(st.sampled_from([None, *vendors]))
    units: tuple[Unit, ...] = ()
    if vendor is not None:
        offered = parent_visible(host, vendor, parent, hierarchy=hierarchy).units
        units = tuple(data.draw(st.lists(st.sampled_from(offered), unique=True, max_size=4)))
    if any(u.mig is not None for u in units) and len(units) > 1:
        with pytest.raises(SelectionError, match="a CUDA process uses one"):
            child_visibility_env(vendor, units, host, parent, hierarchy=hierarchy)
        return
    child = apply(parent, child_visibility_env(vendor, units, host, parent, hierarchy=hierarchy))
    for other in vendors:
        got = parent_visible(host, other, child, hierarchy=None).units
        if other is not vendor:
            assert got == (), (other, child)
        elif other is Vendor.INTEL:
            assert set(got) == set(units), child  # in driver order, same hierarchy
        else:
            assert got == units, child  # CUDA and ROCR keep the order we wrote
