"""Table tests for core.masks: one row per row of the reference tables.

device-semantics.md 4.1 (CUDA, observed on 2x H200), 2.1/2.2 (Level Zero hierarchy and
ZE_AFFINITY_MASK, spec examples on 2 cards x 4 tiles + compute-runtime parsing facts), 2.4
(ONEAPI_DEVICE_SELECTOR), 5.1 (ROCR/HIP; semantics from ROCr amd_filter_device.cpp and ROCclr
rocdevice.cpp).
"""

from __future__ import annotations

import pytest

from xpulaunch.core.masks import ZE_HIDE_ALL
from xpulaunch.core.masks.cuda import (
    CudaEntry,
    format_cuda_visible_devices,
    parse_cuda_visible_devices,
)
from xpulaunch.core.masks.level_zero import (
    driver_order,
    format_ze_affinity_mask,
    parse_ze_affinity_mask,
    regroup_units,
    resolve_hierarchy,
)
from xpulaunch.core.masks.oneapi import parse_oneapi_device_selector
from xpulaunch.core.masks.rocm import (
    amd_visible,
    format_rocr_visible_devices,
    parse_hip_visible_devices,
    parse_rocr_visible_devices,
)
from xpulaunch.errors import MaskError, UsageError
from xpulaunch.model import Device, Hierarchy, MigDevice, Unit, Vendor

# --- inventories ---------------------------------------------------------------------------

# Reference 4.3, nvidia-smi on the 2x H200 host.
U0 = "GPU-a6026e70-2f8a-387f-486f-d49cebe1fb04"
U1 = "GPU-e436550d-4102-c58c-de2e-988dc6aaa541"
H200 = (
    Device(Vendor.NVIDIA, 0, "NVIDIA H200", "0000:00:06.0", U0),
    Device(Vendor.NVIDIA, 1, "NVIDIA H200", "0000:00:07.0", U1),
)


def intel_card(index: int, bdf: str, tiles: int, *, integrated: bool = False) -> Device:
    return Device(Vendor.INTEL, index, pci_bus_id=bdf, tiles=tiles, integrated=integrated)


# The spec's example host: 2 cards x 4 tiles.
TWO_BY_FOUR = (intel_card(0, "0000:3a:00.0", 4), intel_card(1, "0000:9a:00.0", 4))
MAX1550 = (intel_card(0, "0000:29:00.0", 2), intel_card(1, "0000:9a:00.0", 2))
B580 = intel_card(0, "0000:03:00.0", 1)
UHD770 = intel_card(1, "0000:00:02.0", 1, integrated=True)
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


def cuda_indices(value: str | None, devices: tuple[Device, ...] = H200) -> list[int]:
    return [e.device.index for e in parse_cuda_visible_devices(value, devices).entries]


def ze(value: str | None, devices: tuple[Device, ...], hierarchy: Hierarchy, *, pci: bool = False):
    units = parse_ze_affinity_mask(value, devices, hierarchy, pci_order=pci).units
    return [(u.device.index, u.tile) for u in units]


# --- CUDA_VISIBLE_DEVICES: the 17-row table (reference 4.1) ---------------------------------

CUDA_TABLE = [
    ("unset", None, [0, 1]),
    ("empty hides all", "", []),
    ("-1 hides all", "-1", []),
    ("index 0", "0", [0]),
    ("index 1", "1", [1]),
    ("list order reorders", "1,0", [1, 0]),
    ("negative ends the list", "0,-1,1", [0]),
    ("out-of-range index truncates", "0,7,1", [0]),
    ("out of range alone", "7", []),
    ("garbage", "foo", []),
    ("garbage ends the list", "0,foo,1", [0]),
    ("leading space", " 1", [1]),
    ("trailing space", "1 ", [1]),
    ("UUID prefix", "GPU-e436550d", [1]),
    ("full UUID", U1, [1]),
    ("full UUID then prefix", f"{U0},GPU-e43655", [0, 1]),
    ("ambiguous bare prefix", "GPU-", []),
    ("unknown MIG id", "MIG-GPU-bogus", []),
    ("unknown UUID ends the list", "1,GPU-zzz", [1]),
]


@pytest.mark.parametrize(
    ("value", "expected"), [r[1:] for r in CUDA_TABLE], ids=[r[0] for r in CUDA_TABLE]
)
def test_cuda_table(value: str | None, expected: list[int]) -> None:
    assert cuda_indices(value) == expected


def test_cuda_repeated_index_is_an_error_naming_variable_value_and_device() -> None:
    with pytest.raises(MaskError) as info:
        parse_cuda_visible_devices("0,0", H200)
    message = info.value.message
    assert "CUDA_VISIBLE_DEVICES='0,0'" in message and "nvidia 0" in message
    assert "\n" not in message and isinstance(info.value, UsageError)


def test_cuda_index_and_uuid_of_the_same_gpu_is_shown_once() -> None:
    # Seen on 2x H200 (docs/hardware/2026-11-22-h200x2/masks_driver.log): the driver accepted
    # "1,GPU-<prefix of 1>" and showed GPU 1 once, while "0,0" fails to initialise.
    seen = parse_cuda_visible_devices(f"1,{U1[:12]}", H200)
    assert [e.device.index for e in seen.entries] == [1]
    assert any("again" in n for n in seen.notes)


def test_cuda_repeat_after_the_end_of_the_list_is_not_seen() -> None:
    assert cuda_indices("0,foo,0") == [0]


def test_cuda_truncation_notes_name_the_bad_entry_and_what_is_ignored() -> None:
    notes = parse_cuda_visible_devices("0,7,1", H200).notes
    assert any("'7'" in n and "ignores every entry after it" in n for n in notes)
    assert any("sees no GPU" in n for n in parse_cuda_visible_devices("", H200).notes)


def test_cuda_programming_guide_example_on_four_gpus() -> None:
    four = tuple(Device(Vendor.NVIDIA, i, uuid=f"GPU-{i}000aaaa") for i in range(4))
    assert cuda_indices("0,2,-1,1", four) == [0, 2]


def test_cuda_leading_digits_are_read_like_strtoul() -> None:
    visible = parse_cuda_visible_devices("1gpu", H200)
    assert [e.device.index for e in visible.entries] == [1]
    assert any("read as 1" in n for n in visible.notes)


def test_cuda_numbers_are_nvml_indices_not_positions() -> None:
    gap = (Device(Vendor.NVIDIA, 0, uuid="GPU-aa"), Device(Vendor.NVIDIA, 2, uuid="GPU-bb"))
    assert cuda_indices("2", gap) == [2]
    assert cuda_indices("1", gap) == []


MIG_A = MigDevice("MIG-1a2b3c4d-0000-5000-8000-000000000001")
MIG_B = MigDevice("MIG-1a2b3c4d-0000-5000-8000-000000000002")
A100 = (
    Device(
        Vendor.NVIDIA, 0, "NVIDIA A100", "0000:07:00.0", "GPU-0d1e2f30", mig_devices=(MIG_A, MIG_B)
    ),
    Device(Vendor.NVIDIA, 1, "NVIDIA A100", "0000:0f:00.0", "GPU-9f8e7d6c"),
)


def test_cuda_mig_id_names_the_instance_and_its_gpu() -> None:
    (entry,) = parse_cuda_visible_devices(MIG_B.uuid, A100).entries
    assert entry == CudaEntry(A100[0], MIG_B)


def test_cuda_keeps_only_the_first_mig_instance() -> None:
    visible = parse_cuda_visible_devices(f"{MIG_A.uuid},{MIG_B.uuid}", A100)
    assert [e.mig for e in visible.entries] == [MIG_A]
    assert any("one MIG instance" in n for n in visible.notes)


def test_cuda_mig_prefix_must_be_unique_and_not_repeated() -> None:
    assert parse_cuda_visible_devices("MIG-1a2b3c4d", A100).entries == ()
    with pytest.raises(MaskError):
        parse_cuda_visible_devices(f"{MIG_A.uuid},{MIG_A.uuid}", A100)


def test_format_cuda_prefers_uuids_and_keeps_order() -> None:
    assert format_cuda_visible_devices([CudaEntry(H200[1]), CudaEntry(H200[0])]) == f"{U1},{U0}"
    assert format_cuda_visible_devices([]) == ""


def test_format_cuda_falls_back_to_physical_indices_when_a_uuid_is_missing() -> None:
    bare = (Device(Vendor.NVIDIA, 3), Device(Vendor.NVIDIA, 5, uuid="GPU-x"))
    assert format_cuda_visible_devices([CudaEntry(bare[1]), CudaEntry(bare[0])]) == "5,3"


def test_format_cuda_writes_mig_instances_by_mig_uuid() -> None:
    entries = [CudaEntry(A100[0], MIG_B), CudaEntry(A100[1])]
    assert format_cuda_visible_devices(entries) == f"{MIG_B.uuid},GPU-9f8e7d6c"


def test_format_cuda_refuses_a_repeated_device() -> None:
    with pytest.raises(MaskError):
        format_cuda_visible_devices([CudaEntry(H200[0]), CudaEntry(H200[0])])


# --- Level Zero order and hierarchy (reference 2.1, 2.2) -----------------------------------


def test_driver_order_puts_the_igpu_after_the_dgpu_unless_pci_order() -> None:
    assert driver_order((UHD770, B580), pci_order=False) == (B580, UHD770)
    assert driver_order((B580, UHD770), pci_order=True) == (UHD770, B580)


def test_driver_order_is_pci_address_among_discrete_cards() -> None:
    cards = (intel_card(5, "0000:9A:00.0", 1), intel_card(6, "0000:1a:00.0", 1))
    assert [d.index for d in driver_order(cards, pci_order=False)] == [6, 5]


HIERARCHY_TABLE = [
    ("FLAT from env", "FLAT", TWO_BY_FOUR, Hierarchy.FLAT),
    ("COMPOSITE from env", "COMPOSITE", MAX1550, Hierarchy.COMPOSITE),
    ("COMBINED from env", "COMBINED", (B580,), Hierarchy.COMBINED),
    ("Max 1550 default FLAT", None, MAX1550, Hierarchy.FLAT),
    ("Arc default COMPOSITE", None, (B580, UHD770), Hierarchy.COMPOSITE),
    ("mixed host: any multi-tile card", None, (B580, *MAX1550), Hierarchy.FLAT),
    ("lower case is not valid", "flat", (B580,), Hierarchy.COMPOSITE),
    ("garbage falls back", "TILES", MAX1550, Hierarchy.FLAT),
]


@pytest.mark.parametrize(
    ("value", "devices", "expected"),
    [r[1:] for r in HIERARCHY_TABLE],
    ids=[r[0] for r in HIERARCHY_TABLE],
)
def test_resolve_hierarchy(
    value: str | None, devices: tuple[Device, ...], expected: Hierarchy
) -> None:
    hierarchy, note = resolve_hierarchy(value, devices)
    assert hierarchy is expected
    assert "ZE_FLAT_DEVICE_HIERARCHY" in note


def test_resolve_hierarchy_says_why_lower_case_is_ignored() -> None:
    _, note = resolve_hierarchy("flat", MAX1550)
    assert "'flat'" in note and "default FLAT" in note


# Reference 2.2, spec examples for 2 cards x 4 tiles: (mask, [(card, tile), ...]).
COMPOSITE_TABLE = [
    ("0,1", [(0, None), (1, None)]),  # everything, same as unset
    ("1", [(1, None)]),  # card 1 with all its tiles
    ("0.0", [(0, 0)]),
    ("1.1,1.2", [(1, 1), (1, 2)]),
    ("0.2,1.3,1.0,0.3", [(0, 2), (0, 3), (1, 0), (1, 3)]),  # driver order, not mask order
]
FLAT_TABLE = [
    ("0", [(0, 0)]),
    ("1", [(0, 1)]),
    ("0,4", [(0, 0), (1, 0)]),
    ("1,2,7", [(0, 1), (0, 2), (1, 3)]),
    ("0.0", []),  # not valid under FLAT: skipped
]


@pytest.mark.parametrize(("mask", "expected"), COMPOSITE_TABLE)
def test_ze_composite_spec_table(mask: str, expected: list[tuple[int, int | None]]) -> None:
    assert ze(mask, TWO_BY_FOUR, Hierarchy.COMPOSITE) == expected


@pytest.mark.parametrize(("mask", "expected"), FLAT_TABLE)
@pytest.mark.parametrize("hierarchy", [Hierarchy.FLAT, Hierarchy.COMBINED])
def test_ze_flat_spec_table(
    hierarchy: Hierarchy, mask: str, expected: list[tuple[int, int | None]]
) -> None:
    assert ze(mask, TWO_BY_FOUR, hierarchy) == expected


ALL_TILES = [(c, t) for c in (0, 1) for t in range(4)]

# Reference 2.2 "implementation facts" (compute-runtime parseAffinityMask) under FLAT.
ZE_FACTS = [
    ("unset", None, ALL_TILES),
    ("empty shows everything", "", ALL_TILES),
    ("literal default", "default", ALL_TILES),
    ("out of range skipped, later entries apply", "0,9,1", [(0, 0), (0, 1)]),
    ("only X.Y entries: zero devices", "0.1,1.1", []),
    ("order ignored", "5,0", [(0, 0), (1, 1)]),
    ("duplicates harmless", "2,2", [(0, 2)]),
    ("leading spaces", "  3", [(0, 3)]),
    ("hex", "0x4", [(1, 0)]),
    ("leading 0 is octal", "07", [(1, 3)]),
    ("octal 010 is 8: out of range", "010", []),
    ("-1 wraps: skipped", "-1", []),
    ("2**32 wraps to 0 in the uint32 cast", "4294967296", [(0, 0)]),
    ("trailing text ignored by stoul", "6abc", [(1, 2)]),
    ("trailing comma dropped by split", "1,", [(0, 1)]),
]


@pytest.mark.parametrize(
    ("value", "expected"), [r[1:] for r in ZE_FACTS], ids=[r[0] for r in ZE_FACTS]
)
def test_ze_parsing_facts_under_flat(value: str | None, expected: list[tuple[int, int]]) -> None:
    assert ze(value, TWO_BY_FOUR, Hierarchy.FLAT) == expected


def test_ze_leading_zero_is_octal_not_decimal() -> None:
    four_by_four = tuple(intel_card(i, f"0000:{0x10 * (i + 1):02x}:00.0", 4) for i in range(4))
    assert ze("010", four_by_four, Hierarchy.FLAT) == [(2, 0)]  # 8, not 10
    assert ze("0x0a", four_by_four, Hierarchy.FLAT) == [(2, 2)]
    ten = tuple(Device(Vendor.AMD, i) for i in range(10))
    assert [d.index for d in parse_rocr_visible_devices("010", ten)] == [8]


def test_ze_empty_is_not_cuda_empty() -> None:
    assert ze("", TWO_BY_FOUR, Hierarchy.COMPOSITE) == [(0, None), (1, None)]
    assert cuda_indices("") == []


def test_ze_composite_tile_out_of_range_is_skipped() -> None:
    visible = parse_ze_affinity_mask("0.4,1.3", TWO_BY_FOUR, Hierarchy.COMPOSITE, pci_order=False)
    assert [(u.device.index, u.tile) for u in visible.units] == [(1, 3)]
    assert any("'0.4' skipped" in n for n in visible.notes)


def test_ze_composite_all_tiles_listed_one_by_one_is_the_whole_card() -> None:
    assert ze("1.0,1.1,1.2,1.3", TWO_BY_FOUR, Hierarchy.COMPOSITE) == [(1, None)]


@pytest.mark.parametrize(
    "value",
    ["foo", "0,foo", "0.x", "0,,1", ",0", " ", "."],
)
@pytest.mark.parametrize("hierarchy", list(Hierarchy))
def test_ze_values_that_crash_the_driver_are_mask_errors(value: str, hierarchy: Hierarchy) -> None:
    with pytest.raises(MaskError) as info:
        parse_ze_affinity_mask(value, TWO_BY_FOUR, hierarchy, pci_order=False)
    assert "ZE_AFFINITY_MASK" in info.value.message and "\n" not in info.value.message


def test_ze_notes_explain_skips_and_reading() -> None:
    notes = parse_ze_affinity_mask("0x4,9,1.1", TWO_BY_FOUR, Hierarchy.FLAT, pci_order=False).notes
    assert any("read by the driver as 4" in n for n in notes)
    assert any("'9' skipped" in n for n in notes)
    assert any("'1.1' skipped" in n and "FLAT" in n for n in notes)


def test_max1550_flat_index_is_tiles_before_plus_tile() -> None:
    assert ze("3", MAX1550, Hierarchy.FLAT) == [(1, 1)]  # reference 2.2: "3" = card 1 tile 1
    assert ze(None, MAX1550, Hierarchy.FLAT) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert ze("1", MAX1550, Hierarchy.COMPOSITE) == [(1, None)]
    assert ze("0.1", MAX1550, Hierarchy.COMPOSITE) == [(0, 1)]


def test_arc_igpu_mask_follows_driver_order() -> None:
    host = (UHD770, B580)
    assert ze("0", host, Hierarchy.COMPOSITE) == [(0, None)]  # the B580
    assert ze("0", host, Hierarchy.COMPOSITE, pci=True) == [(1, None)]  # the iGPU at 00:02.0
    assert ze(None, host, Hierarchy.COMPOSITE) == [(0, None), (1, None)]
    assert ze(None, host, Hierarchy.FLAT) == [(0, 0), (1, 0)]  # single-tile cards: tile 0


def test_format_ze_flat_sorted_unique_and_whole_cards_expand() -> None:
    units = [Unit(TWO_BY_FOUR[1], 3), Unit(TWO_BY_FOUR[0]), Unit(TWO_BY_FOUR[0], 1)]
    assert format_ze_affinity_mask(units, TWO_BY_FOUR, Hierarchy.FLAT, pci_order=False) == (
        "0,1,2,3,7"
    )


def test_format_ze_composite_cards_and_tiles() -> None:
    units = [Unit(TWO_BY_FOUR[1], 2), Unit(TWO_BY_FOUR[0]), Unit(TWO_BY_FOUR[1], 0)]
    mask = format_ze_affinity_mask(units, TWO_BY_FOUR, Hierarchy.COMPOSITE, pci_order=False)
    assert mask == "0,1.0,1.2"
    all_tiles = [Unit(MAX1550[1], 0), Unit(MAX1550[1], 1)]
    assert format_ze_affinity_mask(all_tiles, MAX1550, Hierarchy.COMPOSITE, pci_order=False) == "1"


def test_format_ze_uses_driver_positions_not_inventory_indices() -> None:
    host = (B580, UHD770)
    assert (
        format_ze_affinity_mask([Unit(UHD770)], host, Hierarchy.COMPOSITE, pci_order=False) == "1"
    )
    assert format_ze_affinity_mask([Unit(UHD770)], host, Hierarchy.COMPOSITE, pci_order=True) == "0"


def test_format_ze_nothing_hides_everything() -> None:
    mask = format_ze_affinity_mask([], MAX1550, Hierarchy.FLAT, pci_order=False)
    assert mask == ZE_HIDE_ALL
    assert parse_ze_affinity_mask(mask, MAX1550, Hierarchy.FLAT, pci_order=False).units == ()


def test_format_ze_refuses_units_it_cannot_name() -> None:
    with pytest.raises(MaskError):
        format_ze_affinity_mask([Unit(B580)], MAX1550, Hierarchy.FLAT, pci_order=False)
    with pytest.raises(MaskError):
        format_ze_affinity_mask([Unit(MAX1550[0], 2)], MAX1550, Hierarchy.FLAT, pci_order=False)


def test_regroup_units_between_hierarchies() -> None:
    tiles = [Unit(MAX1550[0], 1), Unit(MAX1550[0], 0), Unit(MAX1550[1], 1)]
    composite = regroup_units(tiles, MAX1550, Hierarchy.COMPOSITE, pci_order=False)
    assert composite == (Unit(MAX1550[0]), Unit(MAX1550[1], 1))
    flat = regroup_units(composite, MAX1550, Hierarchy.FLAT, pci_order=False)
    assert flat == (Unit(MAX1550[0], 0), Unit(MAX1550[0], 1), Unit(MAX1550[1], 1))


# --- ONEAPI_DEVICE_SELECTOR (reference 2.4), three Level Zero GPUs after the ZE mask --------

ODS_TABLE = [
    ("level_zero:gpu", (0, 1, 2)),
    ("level_zero:0,1", (0, 1)),
    ("level_zero:0;level_zero:1", (0, 1)),
    ("opencl:gpu;level_zero:gpu", (0, 1, 2)),
    ("!opencl:*", (0, 1, 2)),
    ("*:gpu;!cuda:*", (0, 1, 2)),
    ("level_zero:0.*", (0,)),
    ("level_zero:*,*.*", (0, 1, 2)),
    ("LEVEL_ZERO:GPU", (0, 1, 2)),
    ("level_zero:*;!level_zero:1", (0, 2)),
    ("!level_zero:1", (0, 2)),
    ("opencl:*", ()),
    ("cuda:*;hip:gpu", ()),
    ("level_zero:cpu", ()),
    ("level_zero:2,7", (2,)),
    ("level_zero:1.0", (1,)),
    ("ext_oneapi_level_zero:0", (0,)),
]


@pytest.mark.parametrize(("value", "expected"), ODS_TABLE)
def test_oneapi_device_selector_table(value: str, expected: tuple[int, ...]) -> None:
    assert parse_oneapi_device_selector(value, 3).positions == expected


def test_oneapi_unset_and_empty_keep_everything() -> None:
    assert parse_oneapi_device_selector(None, 2).positions == (0, 1)
    assert parse_oneapi_device_selector("", 2).positions == (0, 1)


def test_oneapi_notes() -> None:
    def notes(value: str) -> str:
        return " | ".join(parse_oneapi_device_selector(value, 3).notes)

    assert "twice" in notes("opencl:gpu;level_zero:gpu")
    assert "twice" not in notes("*:gpu;!opencl:*")
    assert "matches nothing" in notes("level_zero:7")
    assert "sub-devices" in notes("level_zero:0.*")
    assert "no Level Zero GPU" in notes("opencl:*")


@pytest.mark.parametrize(
    "value",
    [
        "level_zero",  # no ':'
        "gpu",  # no backend
        "level_zero:",  # empty device list
        "level_zero:,",
        "foo:gpu",
        "level_zero:gpu:0",  # too many colons
        "level_zero:gpu.0",  # a type takes no sub-device
        "level_zero:*.0",  # wildcard parent, numbered child
        "level_zero:0.*.1",
        "level_zero:0.1.2.3",
        "level_zero:-1",
        "level_zero:tpu",
        ";!",
    ],
)
def test_oneapi_malformed_selectors_are_mask_errors(value: str) -> None:
    with pytest.raises(MaskError) as info:
        parse_oneapi_device_selector(value, 3)
    assert "ONEAPI_DEVICE_SELECTOR" in info.value.message


# --- ROCR_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES (reference 5.1) --------------------------


def rocr(value: str | None) -> list[int]:
    return [d.index for d in parse_rocr_visible_devices(value, MI300X)]


ROCR_TABLE = [
    ("unset", None, [0, 1, 2, 3]),
    ("empty surfaces zero devices", "", []),
    ("indices and a UUID, in list order", "2,GPU-4b2c1a9f0c1d2e3f", [2, 0]),
    ("UUID prefix, case-insensitive", "gpu-7e5f", [3]),
    ("repeat ends the list", "1,1,2", [1]),
    ("out of range ends the list", "0,9,1", [0]),
    ("negative ends the list", "0,-1,1", [0]),
    ("strtol base 0: hex", "0x2", [2]),
    ("strtol base 0: octal 010 is 8", "010", []),
    ("trailing text ends the list", "1,2abc,3", [1]),
    ("spaces trimmed", " 3 , 1", [3, 1]),
    ("UUID too short", "GPU-", []),
    ("too-short UUID ends the list", "0,GPU-", [0]),
    ("unknown UUID", "GPU-ffff", []),
    ("only one token per GPU is read", "0,1,2,3,junk", [0, 1, 2, 3]),
    ("int32 truncation of strtol", "4294967297", [1]),
]


@pytest.mark.parametrize(
    ("value", "expected"), [r[1:] for r in ROCR_TABLE], ids=[r[0] for r in ROCR_TABLE]
)
def test_rocr_table(value: str | None, expected: list[int]) -> None:
    assert rocr(value) == expected


def test_rocr_ambiguous_uuid_prefix_ends_the_list() -> None:
    twins = (
        Device(Vendor.AMD, 0, uuid="GPU-abcd000000000001"),
        Device(Vendor.AMD, 1, uuid="GPU-abcd000000000002"),
    )
    assert parse_rocr_visible_devices("1,GPU-abcd0,0", twins) == (twins[1],)
    assert parse_rocr_visible_devices("GPU-abcd000000000002", twins) == (twins[1],)


def test_rocr_empty_entry_is_a_mask_error() -> None:
    with pytest.raises(MaskError, match="ROCR_VISIBLE_DEVICES"):
        parse_rocr_visible_devices("0,,1", MI300X)


def hip(value: str | None, rocr_value: str | None = "2,3") -> list[int]:
    after = parse_rocr_visible_devices(rocr_value, MI300X)
    return [d.index for d in parse_hip_visible_devices(value, after, rocr_value=rocr_value)]


HIP_TABLE = [
    ("unset: what ROCR left", None, [2, 3]),
    ("empty: no HIP filtering", "", [2, 3]),
    ("relative to ROCR", "1", [3]),
    ("reorders", "1,0", [3, 2]),
    ("repeat skipped", "0,0", [2]),
    ("out of range ends the list", "0,5", [2]),
    ("not plain decimal ends the list", "01", []),
    ("UUID substring", "GPU-6d4e3c1b", [2]),
    ("UUID not left by ROCR", "GPU-4b2c1a9f", []),
]


@pytest.mark.parametrize(
    ("value", "expected"), [r[1:] for r in HIP_TABLE], ids=[r[0] for r in HIP_TABLE]
)
def test_hip_table(value: str | None, expected: list[int]) -> None:
    assert hip(value) == expected


def test_hip_listing_more_devices_than_rocr_is_the_torch_error() -> None:
    with pytest.raises(MaskError, match=r"HIP_VISIBLE_DEVICES='0,1,2'.*ROCR_VISIBLE_DEVICES='2,3'"):
        hip("0,1,2")
    assert hip("0,1,2", rocr_value=None) == [0, 1, 2]  # no ROCR: HIP indexes every GPU


def test_amd_visible_composes_rocr_then_hip_with_notes() -> None:
    seen = amd_visible("3,0,junk", "1", MI300X)
    assert [d.index for d in seen.devices] == [0]
    assert any("ROCr stops at 'JUNK'" in n for n in seen.notes)


def test_format_rocr_prefers_uuids() -> None:
    assert format_rocr_visible_devices([MI300X[3], MI300X[1]]) == (
        "GPU-7e5f4d2c3f405162,GPU-5c3d2b0a1d2e3f40"
    )
    odd = Device(Vendor.AMD, 7, uuid="a4ff74a1-0000-1000-80ed-b4a9eb5ed4cd")
    assert format_rocr_visible_devices([odd, Device(Vendor.AMD, 2)]) == "7,2"
    with pytest.raises(MaskError):
        format_rocr_visible_devices([MI300X[0], MI300X[0]])
